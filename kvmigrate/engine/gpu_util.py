"""GPU utilisation from where a cluster already has it: a DCGM exporter's /metrics, or a
Prometheus server's answer to an instant query. vLLM itself does not export it."""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from kvmigrate.engine.prom_text import parse

DCGM_UTIL = "DCGM_FI_DEV_GPU_UTIL"  # percent busy over the exporter's sampling interval


class UnreadableAnswer(ValueError):
    """An answer with no utilisation in it; the message says what was wrong."""


@dataclass(frozen=True, slots=True)
class GpuSample:
    util_pct: float  # mean over the GPUs listed, 0..100
    gpus: int | None  # how many (None: a query's answer does not say)
    bad_lines: int = 0


def read_dcgm(text: str) -> GpuSample:
    parsed = parse(text, (DCGM_UTIL,))
    # One series per GPU; an exporter scraping one node lists each GPU once, by `gpu` (its
    # index) and `UUID`. Keyed by both, so two exporters' GPU 0 are two GPUs.
    per_gpu: dict[tuple[str, str, str], float] = {}
    for series in parsed.named(DCGM_UTIL):
        labels = series.labels
        key = (labels.get("UUID", ""), labels.get("Hostname", ""), labels.get("gpu", ""))
        if 0.0 <= series.value <= 100.0:  # a percent; NaN and 1e308 are no reading
            per_gpu[key] = series.value
    if not per_gpu:
        raise UnreadableAnswer(f"no {DCGM_UTIL} series in the answer")
    return GpuSample(sum(per_gpu.values()) / len(per_gpu), len(per_gpu), parsed.bad_lines)


def read_prometheus(body: bytes) -> GpuSample:
    """The first value of an instant query's vector or scalar result (`/api/v1/query`)."""
    try:
        answer = orjson.loads(body)
        result = answer["data"]["result"]
        if answer.get("status") != "success":
            raise UnreadableAnswer(f"the query failed: {answer.get('error', 'no reason given')}")
        if answer["data"].get("resultType") == "scalar":
            value = float(result[1])
        elif result:
            value = float(result[0]["value"][1])
        else:
            raise UnreadableAnswer("the query returned no series")
    except UnreadableAnswer:
        raise
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, ValueError) as exc:
        raise UnreadableAnswer(f"not a Prometheus query answer ({type(exc).__name__})") from None
    if not 0.0 <= value <= 100.0:
        raise UnreadableAnswer("the query returned a value that is not a percent (0 to 100)")
    return GpuSample(value, None)
