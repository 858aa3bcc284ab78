"""How long one engine step takes: the simulator's only notion of the hardware's speed.

A vLLM step runs one forward pass over a batch: the prompt tokens being prefilled (those
not found in the prefix cache), one token for each sequence decoding, and, for a prompt
whose history is cached, the attention over that history (read, not recomputed). So

    step_s = overhead_s + prefill * prefill_token_s + cached * cached_token_s
             + pairs * attention_s + decoding * decode_seq_s

where `pairs` counts, for each prompt chunk computed, its tokens times the context they
attend to (the tokens before the chunk plus half the chunk): attention's quadratic share,
small on a GPU at 8B but most of the cost for a small model on a CPU.

and a request's first token reaches the client `request_s` after its step ends (HTTP,
tokenizing, detokenizing: time outside the engine that occupies no GPU).

The defaults are an 8B model on one H200, from the figures the brief measured (and the
emulator's vLLM profile uses): a full prefill of 10,150 tokens takes 327 ms (two chunks of
the 8,192-token budget), 700 new tokens on a cached 9,450-token history 50 ms, about
32,500 prefill tokens/s; a decode step of one sequence about 5 ms. They are a starting
point: `kvmigrate plan --calibrate URL` fits them to a real endpoint.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

DEFAULT_DECODE_SEQ_S = 1.0e-4
# No term of a step is an hour: a larger figure (or Infinity, which Python's json reads) is
# a broken file, and it overflowed the simulator's times to a TTFT of 0 ms that met any SLO.
MAX_COST_S = 3600.0


def _valid_seconds(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 <= value <= MAX_COST_S
    )


@dataclass(frozen=True, slots=True)
class CostModel:
    overhead_s: float = 0.005  # per step: scheduling, sampling, kernel launches
    prefill_token_s: float = 1 / 32_500  # per prompt token computed
    cached_token_s: float = 2.0e-6  # per cached prompt token attended during its prefill
    decode_seq_s: float = DEFAULT_DECODE_SEQ_S  # per sequence decoding in the step
    request_s: float = 0.005  # per request, outside the engine
    attention_s: float = 0.0  # per (prompt token computed x context token it attends to)
    source: str = "default: 8B model on one H200"

    def step_s(self, prefill: int, cached: int, decoding: int, pairs: float = 0.0) -> float:
        return (
            self.overhead_s
            + prefill * self.prefill_token_s
            + cached * self.cached_token_s
            + pairs * self.attention_s
            + decoding * self.decode_seq_s
        )

    def problem(self) -> str | None:
        """Why this model cannot describe an engine, or None. A prompt token or a decode step
        that costs nothing makes every TTFT 0 ms and meets any SLO."""
        if self.prefill_token_s <= 0:
            return "prefill_token_s is 0: a prompt would cost nothing to compute"
        if self.overhead_s + self.decode_seq_s <= 0:
            return "overhead_s and decode_seq_s are both 0: a decode step would take no time"
        return None

    def to_json(self) -> dict[str, float | str]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: object) -> CostModel:
        if not isinstance(data, dict):
            raise ValueError(f"a cost model is a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = set(map(str, data)) - known
        if unknown:
            raise ValueError(f"unknown cost model keys: {', '.join(sorted(unknown))}")
        values: dict[str, float | str] = {}
        for key, value in data.items():
            if key == "source":
                values[key] = str(value)
            elif _valid_seconds(value):
                values[key] = float(value)
            else:
                raise ValueError(
                    f"cost model {key} must be a number of seconds from 0 to "
                    f"{MAX_COST_S:g}, got {value!r}"
                )
        model = cls(**values)  # type: ignore[arg-type]
        problem = model.problem()
        if problem is not None:
            raise ValueError(f"cost model {problem}")
        return model

    @classmethod
    def load(cls, path: Path) -> CostModel:
        return cls.from_json(json.loads(path.read_text(encoding="utf-8")))


@dataclass(frozen=True, slots=True)
class Probe:
    """One single-request measurement: its prompt, how much of it was cached, TTFT, and the
    mean time between its later tokens (None with one output token)."""

    prompt_tokens: int
    cached_tokens: int
    ttft_s: float
    itl_s: float | None = None


def _solve(matrix: list[list[float]], vector: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting; a singular column solves to 0."""
    n = len(vector)
    a = [[*row, vector[i]] for i, row in enumerate(matrix)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        a[col], a[pivot] = a[pivot], a[col]
        if abs(a[col][col]) < 1e-18:
            continue
        for r in range(n):
            if r != col:
                f = a[r][col] / a[col][col]
                a[r] = [x - f * y for x, y in zip(a[r], a[col], strict=True)]
    return [a[i][n] / a[i][i] if abs(a[i][i]) >= 1e-18 else 0.0 for i in range(n)]


def _least_squares(rows: Sequence[Sequence[float]], ys: Sequence[float]) -> list[float]:
    """Non-negative least squares, by dropping the most negative coefficient and refitting
    (enough for four features, and no numpy). Columns are scaled to 1 first: token counts
    and token pairs differ by six orders of magnitude."""
    width = len(rows[0])
    scale = [max(abs(r[i]) for r in rows) or 1.0 for i in range(width)]
    active = list(range(width))
    out = [0.0] * width
    while active:
        x = [[row[i] / scale[i] for i in active] for row in rows]
        n = len(active)
        ata = [[sum(r[i] * r[j] for r in x) for j in range(n)] for i in range(n)]
        aty = [sum(r[i] * y for r, y in zip(x, ys, strict=True)) for i in range(n)]
        solved = _solve(ata, aty)
        worst = min(range(n), key=lambda i: solved[i])
        if solved[worst] >= 0:
            for i, v in zip(active, solved, strict=True):
                out[i] = v / scale[i]
            return out
        del active[worst]
    return out


def _medians(probes: Sequence[Probe]) -> list[tuple[tuple[int, int], float]]:
    """The median TTFT of each probe shape (prompt and cached tokens, to a 16-token
    grain): one slow outlier on a busy machine must not tilt the whole fit."""
    shapes: dict[tuple[int, int], list[Probe]] = {}
    for p in probes:
        shapes.setdefault((p.prompt_tokens // 16, p.cached_tokens // 16), []).append(p)
    out = []
    for group in shapes.values():
        group.sort(key=lambda p: p.ttft_s)
        middle = group[len(group) // 2]
        out.append(((middle.prompt_tokens, middle.cached_tokens), middle.ttft_s))
    return out


def attention_pairs(start: int, chunk: int) -> float:
    """Token pairs a chunk of `chunk` prompt tokens attends, after `start` tokens."""
    return chunk * (start + chunk / 2)


def fit(
    probes: Sequence[Probe], label: str, batch_itl: tuple[int, float] | None = None
) -> CostModel:
    """Fit the costs to single-request probes, plus, when given, the inter-token time of
    `batch_itl[0]` sequences decoding together.

    A lone request's inter-token time is one decode step of one sequence (overhead plus
    one sequence); a batch's adds a sequence's cost per extra sequence, which separates
    the two. A lone prompt's TTFT is one step's overhead plus the request's own time, its
    new tokens, its cached tokens and its attention pairs. Needs cold and cached probes of
    at least two lengths."""
    if len({(p.prompt_tokens // 16, p.cached_tokens // 16) for p in probes}) < 4:
        raise ValueError("calibration needs probes of at least four distinct shapes")
    itls = sorted(p.itl_s for p in probes if p.itl_s is not None)
    itl = itls[len(itls) // 2] if itls else 0.0
    decode_seq = DEFAULT_DECODE_SEQ_S
    if batch_itl is not None and batch_itl[0] > 1:
        decode_seq = max(0.0, (batch_itl[1] - itl) / (batch_itl[0] - 1))
    overhead = max(0.0, itl - decode_seq)
    rows, ys = [], []
    for (prompt, cached), ttft in _medians(probes):
        new = max(1, prompt - cached)
        rows.append((1.0, float(new), float(cached), attention_pairs(cached, new)))
        ys.append(ttft - overhead)
    request, per_token, per_cached, per_pair = _least_squares(rows, ys)
    return CostModel(
        overhead_s=overhead,
        prefill_token_s=per_token,
        cached_token_s=per_cached,
        decode_seq_s=decode_seq,
        request_s=request,
        attention_s=per_pair,
        source=label,
    )
