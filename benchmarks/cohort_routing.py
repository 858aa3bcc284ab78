"""What 100 configured cohorts add to routing a request, in microseconds, over one cohort.

Routing here is what the proxy does per request before it calls a backend: resolve the
request's cohort (`CohortResolver.resolve`: headers, metadata, key label) and route it by
that cohort's snapshot with its pin (`LiveRollout.route`, split mode at 50%, pinning on).
  one       one model, no named cohort (a round-1 config)
  hundred   10 models with 9 named cohorts each (100 cohorts); the request's model has 9
            header/metadata selectors and matches the last (the longest scan), or none
Target (issue 19): 100 cohorts add at most 0.05 ms p50 over one.

    python benchmarks/cohort_routing.py [--requests 20000] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from multidict import CIMultiDict, CIMultiDictProxy

from kvmigrate.config import Config, parse_config
from kvmigrate.proxy.cohorts import CohortResolver
from kvmigrate.rollout.controller import initial_state
from kvmigrate.rollout.live import LiveRollout
from kvmigrate.rollout.store import open_store

MODELS = 10
NAMED_PER_MODEL = 9


def config_text(state: str, cohorts: bool) -> str:
    models = MODELS if cohorts else 1
    lines = [
        "backends:",
        '  hosted: {api_base: "http://127.0.0.1:9/v1"}',
        '  vllm: {api_base: "http://127.0.0.1:9/v1"}',
        "models:",
        *(f"  - {{model_name: m{i}, hosted: h{i}, vllm: v{i}}}" for i in range(models)),
        f'rollout: {{state: "{state}", mode: split, percent: 50}}',
    ]
    if cohorts:
        lines.append("cohorts:")
        for i in range(MODELS):
            for j in range(NAMED_PER_MODEL):
                match = f"{{header: {{X-Agent: a{j}}}, metadata: {{team: t{j}}}}}"
                lines.append(f"  - {{name: m{i}-c{j}, model: m{i}, match: {match}}}")
    return "\n".join(lines) + "\n"


async def measure(
    config: Config, headers: CIMultiDictProxy[str], body: dict[str, Any], n: int
) -> list[float]:
    store = open_store(config.rollout.state, initial_state(config))
    live = LiveRollout(config, store)
    resolver = CohortResolver(config)
    served = config.models[0].served
    model = config.models[0].model_name
    timings = []
    try:
        for i in range(n):
            conversation = f"conv-{i % 2000}"  # later turns of 2,000 conversations: pin hits
            start = time.perf_counter_ns()
            cohort = resolver.resolve(model, headers, body)
            await live.route(conversation, 2, served, cohort)
            timings.append((time.perf_counter_ns() - start) / 1000.0)
    finally:
        store.close()
    return timings


def summary(timings: list[float]) -> dict[str, float]:
    ordered = sorted(timings)
    return {
        "p50_us": statistics.median(ordered),
        "p99_us": ordered[int(len(ordered) * 0.99)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        state = f"sqlite:///{Path(tmp)}/state.db"
        one = parse_config(config_text(state, False), env={})
        hundred = parse_config(config_text(state, True), env={})
        assert len(one.cohort_names()) == 1
        assert len(hundred.cohort_names()) == 100
        body = {"model": "m0", "metadata": {"team": f"t{NAMED_PER_MODEL - 1}"}}
        last = CIMultiDictProxy(CIMultiDict({"X-Agent": f"a{NAMED_PER_MODEL - 1}"}))
        none = CIMultiDictProxy(CIMultiDict({"X-Agent": "nobody"}))
        results = {}
        for name, config, headers, request in (
            ("one", one, none, {"model": "m0"}),
            ("hundred, last selector matches", hundred, last, body),
            ("hundred, none matches", hundred, none, {"model": "m0"}),
        ):
            asyncio.run(measure(config, headers, request, 2_000))  # warm-up
            results[name] = summary(asyncio.run(measure(config, headers, request, args.requests)))
    base = results["one"]["p50_us"]
    added = {k: v["p50_us"] - base for k, v in results.items() if k != "one"}
    if args.json:
        print(json.dumps({"results": results, "added_p50_us": added}, indent=2))
        return
    for name, figures in results.items():
        print(f"{name:32} p50 {figures['p50_us']:7.2f} us   p99 {figures['p99_us']:7.2f} us")
    for name, extra in added.items():
        verdict = "ok" if extra <= 50 else "OVER"
        print(f"added by 100 cohorts ({name}): {extra:+.2f} us p50 (target <= 50 us: {verdict})")


if __name__ == "__main__":
    main()
