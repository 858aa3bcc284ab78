"""How long one engine step takes: the simulator's only notion of the hardware's speed.

A vLLM step runs one forward pass over a batch: the prompt tokens being prefilled (those
not found in the prefix cache), one token for each sequence decoding, and, for a prompt
whose history is cached, the attention over that history (read, not recomputed). So

    step_s = overhead_s + prefill * prefill_token_s + cached * cached_token_s
             + decoding * decode_seq_s

and a request's first token reaches the client `request_s` after its step ends (HTTP,
tokenizing, detokenizing: time outside the engine that occupies no GPU).

The defaults are an 8B model on one H200, from the figures issue 22 gives (and the
emulator's vLLM profile uses): a full prefill of 10,150 tokens takes 327 ms (two chunks of
the 8,192-token budget), 700 new tokens on a cached 9,450-token history 50 ms, about
32,500 prefill tokens/s; a decode step of one sequence about 5 ms. They are a starting
point: `kvmigrate plan --calibrate URL` fits them to a real endpoint.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path


@dataclass(frozen=True, slots=True)
class CostModel:
    overhead_s: float = 0.005  # per step: scheduling, sampling, kernel launches
    prefill_token_s: float = 1 / 32_500  # per prompt token computed
    cached_token_s: float = 2.0e-6  # per cached prompt token attended during its prefill
    decode_seq_s: float = 1.0e-4  # per sequence decoding in the step
    request_s: float = 0.005  # per request, outside the engine
    source: str = "default: 8B model on one H200"

    def step_s(self, prefill: int, cached: int, decoding: int) -> float:
        return (
            self.overhead_s
            + prefill * self.prefill_token_s
            + cached * self.cached_token_s
            + decoding * self.decode_seq_s
        )

    def to_json(self) -> dict[str, float | str]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, object]) -> CostModel:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown cost model keys: {', '.join(sorted(unknown))}")
        values: dict[str, float | str] = {}
        for key, value in data.items():
            if key == "source":
                values[key] = str(value)
            elif isinstance(value, int | float) and value >= 0:
                values[key] = float(value)
            else:
                raise ValueError(f"cost model {key} must be a number >= 0, got {value!r}")
        return cls(**values)  # type: ignore[arg-type]

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
    """Non-negative least squares by dropping a negative coefficient and refitting: with
    three features that is exact enough, and no numpy is needed."""
    active = list(range(len(rows[0])))
    while True:
        x = [[row[i] for i in active] for row in rows]
        ata = [
            [sum(r[i] * r[j] for r in x) for j in range(len(active))] for i in range(len(active))
        ]
        aty = [sum(r[i] * y for r, y in zip(x, ys, strict=True)) for i in range(len(active))]
        solved = _solve(ata, aty)
        negative = [active[i] for i, v in enumerate(solved) if v < 0]
        if not negative:
            out = [0.0] * len(rows[0])
            for i, v in zip(active, solved, strict=True):
                out[i] = v
            return out
        active = [i for i in active if i != negative[0]]
        if not active:
            return [0.0] * len(rows[0])


def fit(probes: Sequence[Probe], label: str, decode_seq_s: float = 1.0e-4) -> CostModel:
    """Fit the costs to single-request probes. A lone prompt's TTFT is a fixed part (the
    request's own and its step's overhead) plus its new and its cached tokens' costs; its
    inter-token time is one decode step of one sequence, which splits the fixed part into
    the step's share and the request's. What each extra sequence adds to a decode step
    takes concurrent requests to measure, so `decode_seq_s` is given, not fitted. Needs
    cold and cached probes of at least two lengths."""
    if len({(p.prompt_tokens, p.cached_tokens) for p in probes}) < 3:
        raise ValueError("calibration needs probes of at least three distinct shapes")
    rows, ys = [], []
    for p in probes:
        rows.append((1.0, float(max(1, p.prompt_tokens - p.cached_tokens)), float(p.cached_tokens)))
        ys.append(p.ttft_s)
    fixed, per_token, per_cached = _least_squares(rows, ys)
    itls = sorted(p.itl_s for p in probes if p.itl_s is not None)
    step = max(0.0, itls[len(itls) // 2] - decode_seq_s) if itls else fixed / 2
    step = min(step, fixed)
    return CostModel(
        overhead_s=step,
        prefill_token_s=per_token,
        cached_token_s=per_cached,
        decode_seq_s=decode_seq_s,
        request_s=fixed - step,
        source=label,
    )
