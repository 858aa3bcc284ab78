"""Comments and docstrings under kvmigrate/ keep the reason, not a figure a run measured.

A timing quoted in a comment ("took 21 s", "cost 80 us") is true of one machine on one day
and goes stale silently; the comment should say why, and name the benchmark that measures
it (benchmarks/*.py), whose output is the current figure. Figures that are not measurements
stay: protocol limits, config defaults and constants with their units, targets, and
examples worked by reasoning. The guard flags a timing figure with a measuring word near it
(took, measured, profiled, cost, spent, faster, slower, CPU); `ALLOWED` lists the few
legitimate ones, each with why.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "kvmigrate"

TIMING = re.compile(r"(?<![\w.])~?\d+(?:[.,]\d+)?(?:-\d+(?:\.\d+)?)? ?(?:ms|µs|us|s)\b")
MEASURING = re.compile(
    r"\b(?:took|measured|profiled|costs?|spent|faster|slower|of CPU)\b", re.IGNORECASE
)
NEAR = 60  # characters either side of the figure

# (module, words the flagged text holds): figures that are not measurements of our code.
ALLOWED: tuple[tuple[str, str], ...] = (
    # What a zero cost model does to the simulator (a TTFT of zero), not a timing.
    ("plan/cost_model.py", "every TTFT 0 ms"),
)


def figures_in(text: str) -> list[str]:
    """Each timing figure in `text` with a measuring word within NEAR characters, as the
    text around it."""
    found = []
    for match in TIMING.finditer(text):
        around = text[max(0, match.start() - NEAR) : match.end() + NEAR]
        if MEASURING.search(around):
            found.append(around)
    return found


def prose(source: str) -> list[tuple[int, str]]:
    """The module's comment blocks (consecutive comment lines joined) and docstrings, each
    with its first line, whitespace collapsed so a figure and its word may span lines."""
    blocks: list[tuple[int, str]] = []
    last = -2
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        text = token.string.lstrip("#").strip()
        if token.start[0] == last + 1 and blocks:
            blocks[-1] = (blocks[-1][0], f"{blocks[-1][1]} {text}")
        else:
            blocks.append((token.start[0], text))
        last = token.start[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            doc = ast.get_docstring(node, clean=True)
            if doc:
                blocks.append((node.body[0].lineno, doc))
    return [(line, " ".join(text.split())) for line, text in blocks]


def allowed(module: str, around: str) -> bool:
    return any(module == name and words in around for name, words in ALLOWED)


@pytest.mark.parametrize(
    ("text", "flagged"),
    [
        ("the duplicate-key check took 0.28 ms with it", True),
        ("a full collection (40 ms of CPU under load)", True),
        ("2.4 of 14.5 s profiled in the parser", True),
        ("a task per request to shield cost 20 us of CPU per request", True),
        ("about 0.1 s of CPU per start", True),
        ("the 5 ms batches cost 8-12% of the throughput", True),
        ("measured: 10K tokens in ~0.32 s", True),
        # Not measurements: constants, limits, targets, examples.
        ("a batch every quarter second, not every 5 ms", False),
        ("the playbook's flatness target: under 3 s even past 10 turns", False),
        ("the recorder's stop waits 30 s", False),
        ("a candidate failing in 2 ms would pull its p95 down", False),
        ("benchmarks/proxy_overhead.py measures the CPU per request", False),
        ("the 400s worded as Anthropic words them", False),
    ],
)
def test_a_timing_beside_a_measuring_word_is_flagged(text: str, flagged: bool) -> None:
    assert bool(figures_in(text)) is flagged


def test_no_comment_under_kvmigrate_quotes_a_measured_timing() -> None:
    stale = []
    for path in sorted(ROOT.rglob("*.py")):
        module = path.relative_to(ROOT).as_posix()
        for line, text in prose(path.read_text(encoding="utf-8")):
            for around in figures_in(text):
                if not allowed(module, around):
                    stale.append(f"kvmigrate/{module}:{line}: ...{around}...")
    assert not stale, (
        "comments quote measured figures, which go stale: keep the reason and name the "
        "benchmark that measures it (benchmarks/*.py), or list a figure that is not a "
        "measurement in ALLOWED with why:\n" + "\n".join(stale)
    )


def test_every_allowed_figure_is_still_there() -> None:
    """An entry whose comment has gone would let a new stale figure through unseen."""
    for module, words in ALLOWED:
        texts = [text for _, text in prose((ROOT / module).read_text(encoding="utf-8"))]
        assert any(words in around for text in texts for around in figures_in(text)), (
            module,
            words,
        )
