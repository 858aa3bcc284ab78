"""`kvmigrate demo` end to end, as the README's first command runs it (the short story, its
defaults); `--full` only as the options it chooses, for the longer story takes minutes."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvmigrate.cli.demo_cmd import demo
from kvmigrate.demo import FULL, DemoSettings

DEMO_BOUND_S = 220


def run_demo(
    tmp_path: Path, *extra: str, out: bool = True
) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    where = ["--out", str(tmp_path / "report.html")] if out else []
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvmigrate",
            "demo",
            *where,
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=2 * DEMO_BOUND_S,  # a hang, not a slow run
        cwd=tmp_path,
    )
    return proc, time.monotonic() - start


# Past the subprocess's own limit, so that a slow run fails on the bound below, with its
# figure, rather than on pytest's default 300 s.
@pytest.mark.slow
@pytest.mark.timeout(2 * DEMO_BOUND_S + 60)
def test_demo_shadows_reports_and_rolls_out(tmp_path: Path) -> None:
    proc, elapsed = run_demo(tmp_path, "--keep")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "TTFT by turn" in out
    assert "Prefix cache hit by turn" in out
    assert "noise-adjusted parity" in out
    assert "Cost projection" in out
    # Looser gates than config.yaml's, said before the first figure, with both values.
    assert out.splitlines()[1:3] == [
        "gates looser than config.yaml's: min_conversations 8 (config.yaml: 20), min_requests "
        "30 (config.yaml: 100), error_rate_margin 0.1 (config.yaml: 0.01), min_parity 0.8 "
        "(config.yaml: 0.9), min_parity_samples 20 (config.yaml: 30)",
        "why: the demo sends a few dozen conversations, and config.yaml's gates would wait for "
        "hundreds (a 1-point error margin needs about 240 with no errors either side); a real "
        "rollout keeps config.yaml's",
    ]
    for step in ("10%", "50%", "100%"):
        assert f"promoted to {step}" in out
    assert "rollout complete" in out
    # A second model with fewer agents moves on its own rollout, judged on its own traffic,
    # so it lags: the first is complete while it is at most at its first step.
    table = out.split("Each model on its own rollout")[1].splitlines()[2:4]
    rows = {line.split()[0]: line.split() for line in table}
    assert rows["gpt-4o-mini"][1:3] == ["split", "100%"]
    assert rows["gpt-4o"][2] in ("0%", "10%")
    # Off a terminal, progress is one summary line, not a stray label (issue 21 item 14).
    lines = [line.strip() for line in proc.stderr.splitlines()]
    assert "conversations" not in lines
    assert "conversations: 18/18" in lines
    # The playbook's checklist over the whole run, every row with its status; decode speed
    # with its figures and interval (its status depends on how loaded the machine is).
    page = out.split("Scorecard (the playbook's checklist)\n=====", 1)[1]
    card = page.split("\n\n", 2)[1]
    rows = {line.split("  ")[0]: line for line in card.splitlines()[2:]}
    assert list(rows) == [
        "TTFT under 2 s",
        "Tokens per second per stream above 50",
        "Turn-N latency flat (under 3 s past 10 turns)",
        "GPU utilisation 70-80%",
        "Cost per token vs the hosted baseline",
        "TTFT improvement 50%+",
        "Customer satisfaction improving (users stay)",
    ]
    tps = rows["Tokens per second per stream above 50"]
    assert re.search(r"tok/s  +\[[\d.,]+, [\d.,]+\]  +(met|missed|not enough evidence)$", tps)
    # Every row has the candidate's figure: the flatness row from the second model's long
    # conversations, GPU use from the emulated DCGM exporter, cost from the candidate's
    # GPU-hours, satisfaction from the scores the emulated users post to /v1/feedback.
    statuses = ("met", "missed", "not enough evidence")
    for line in rows.values():
        cells = re.split(r"  +", line)
        assert cells[3] != "—", line
        assert cells[6] in statuses, line
    assert "TTFT slope" in rows["Turn-N latency flat (under 3 s past 10 turns)"]
    html = (tmp_path / "report.html").read_text()
    assert html.count('class="chart') >= 5
    assert 'data-table="scorecard"' in html
    assert 'data-limit="3000"' in html  # the 3 s limit on the TTFT chart, drawn or named
    # A quick demo is part of the promise: under a minute on a quiet 2-core machine (59 s
    # beside a load of 5 to 6 on 2 cores), so the bound only catches a demo grown several
    # times longer (the figure itself: benchmarks/demo_time.py).
    assert elapsed < DEMO_BOUND_S, f"the demo took {elapsed:.0f}s"
    # --keep: the directory it names is there afterwards, with the records in it.
    [kept] = [line for line in out.splitlines() if line.startswith("state and records kept in")]
    kept_dir = Path(kept.rsplit(" ", 1)[1])
    assert any(kept_dir.glob("*.db")), sorted(kept_dir.iterdir())
    shutil.rmtree(kept_dir)


@pytest.mark.slow
def test_bad_candidate_is_refused_then_rolled_back(tmp_path: Path) -> None:
    proc, _ = run_demo(tmp_path, "--bad-candidate", out=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "promotion to 10% REFUSED" in proc.stdout
    assert "FAIL  parity" in proc.stdout
    assert "auto-rollback: 10% -> 0%" in proc.stdout
    assert "tool calls are broken" in proc.stdout
    # Without --keep it names no directory that is about to disappear.
    assert "deleted at the end (--keep keeps them)" in proc.stdout
    assert "kept in" not in proc.stdout
    # Without --out the report goes to a directory of its own, named, never the current
    # one (run in a clone, report.html was left untracked in the tree).
    [wrote] = [line for line in proc.stdout.splitlines() if line.startswith("wrote ")]
    report = Path(wrote.removeprefix("wrote "))
    assert report.name == "report.html"
    assert report.parent.name.startswith("kvmigrate-demo-report-")
    assert report.exists()
    assert list(tmp_path.iterdir()) == []
    shutil.rmtree(report.parent)


@pytest.mark.slow
@pytest.mark.parametrize("args", [["--conversations", "0"], ["--time-scale", "-1"]])
def test_bad_options_are_refused(args: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kvmigrate", "demo", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], {"conversations": 18, "turns": 4, "time_scale": 0.15, "bake_factor": 1}),
        (["--full"], FULL),
        (["--full", "--turns", "3"], {**FULL, "turns": 3}),
        (["--conversations", "5"], {"conversations": 5, "turns": 4, "time_scale": 0.15}),
    ],
)
def test_full_chooses_the_longer_story_and_options_still_win(
    args: list[str], expected: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    chosen: list[DemoSettings] = []
    monkeypatch.setattr(
        "kvmigrate.cli.demo_cmd.run_demo", lambda settings, _echo: chosen.append(settings) or True
    )
    result = CliRunner().invoke(demo, args)
    assert result.exit_code == 0, result.output
    [settings] = chosen
    assert {name: getattr(settings, name) for name in expected} == expected
