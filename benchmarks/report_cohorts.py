"""What grouping the report by cohort, and comparing candidates with each other, costs.

A synthetic records DB: `--requests` served answers, each shadowed to two candidates, with
the answers stored (record.content redacted), spread over one cohort or `--cohorts` of
them. It times `build_report` (and, apart, the candidates' comparison in it) and each
renderer on the same records both ways:
  one       every record in one cohort (a round-1 config: the report as before, plus the
            candidates' comparison)
  several   the same records over `--cohorts` cohorts (every section again per cohort)

    python benchmarks/report_cohorts.py [--requests 3000] [--cohorts 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from kvmigrate.recorder.record import Record
from kvmigrate.recorder.store import open_store
from kvmigrate.report import RENDERERS, build_report
from kvmigrate.report.candidate_pairs import paired_answers
from kvmigrate.report.rows import fetch_rows

WORDS = ("the", "invoice", "total", "tax", "line", "looks", "wrong", "please", "check", "again")


def _answer(i: int, shift: int) -> str:
    text = " ".join(WORDS[(i + shift + k) % len(WORDS)] for k in range(12))
    message = {"role": "assistant", "content": text}
    return orjson.dumps(
        {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
    ).decode()


def records(requests: int, cohorts: int, now: float) -> list[Record]:
    out = []
    for i in range(requests):
        common: dict[str, Any] = {
            "ts": now - requests + i, "route": "chat/completions", "model": "m",
            "served_model": "m", "conversation": f"c{i // 4}", "turn": i % 4 + 1,
            "stream": True, "status": 200, "ttft_ms": 20.0 + i % 7, "latency_ms": 80.0 + i % 13,
            "prompt_tokens": 400, "cached_tokens": 300, "completion_tokens": 12,
            "content": "redacted", "cohort": f"cohort-{i % cohorts}",
        }  # fmt: skip
        request = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]})
        body, answer = request.decode(), _answer(i, 0)
        served = Record(request_id=f"p{i}", backend="hosted", role="serve",
                        request_json=body, response_json=answer, **common)  # fmt: skip
        out.append(served)
        for backend, shift in (("vllm", 0), ("vllm-fp8", i % 3)):
            answer = _answer(i, shift)
            out.append(Record(request_id=f"{backend}-{i}", backend=backend, role="shadow",
                              pair_id=f"p{i}", response_json=answer, **common))  # fmt: skip
    return out


def timed(requests: int, cohorts: int) -> dict[str, float]:
    now = time.time()
    with tempfile.TemporaryDirectory() as tmp, open_store(f"sqlite:///{Path(tmp)}/r.db") as store:
        store.insert(records(requests, cohorts, now))
        start = time.perf_counter()
        rows, _ = fetch_rows(store, now - requests - 10, now + 1)
        paired_answers(rows, store)
        compare_s = time.perf_counter() - start
        start = time.perf_counter()
        report = build_report(store, now - requests - 10, now + 1)
        figures = {"build_s": time.perf_counter() - start, "compare_s": compare_s}
        for name, render in RENDERERS.items():
            start = time.perf_counter()
            size = len(render(report))
            figures[f"{name}_s"] = time.perf_counter() - start
            figures[f"{name}_kb"] = size / 1024
        figures["cohorts"] = len(report.cohorts) or 1
        figures["compared"] = sum(p.compared for p in report.candidate_pairs)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--cohorts", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    timed(50, 2)  # warm up: imports and first queries are not the report's cost
    results = {"one": timed(args.requests, 1), "several": timed(args.requests, args.cohorts)}
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{args.requests:,} served requests, each shadowed to 2 candidates (answers stored)")
    for name, f in results.items():
        print(
            f"{name:8} {f['cohorts']:>3.0f} cohort(s): build {f['build_s']:.2f} s "
            f"(of which {f['compare_s']:.2f} s comparing {f['compared']:,.0f} candidate pairs);\n"
            f"{'':22}text {f['text_s']:.2f} s ({f['text_kb']:,.0f} KiB), "
            f"json {f['json_s']:.2f} s, html {f['html_s']:.2f} s ({f['html_kb']:,.0f} KiB)"
        )


if __name__ == "__main__":
    main()
