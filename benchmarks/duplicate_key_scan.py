"""What refusing duplicate top-level keys costs a request (issue 21 item 7).

    .venv/bin/python benchmarks/duplicate_key_scan.py

`parse_body` parses each body once with orjson. The duplicate check adds a `find` and an
`rfind` of `"model"`, memory-speed scans that stop at its first and last spelling (one pass
over the body together); only a body where it occurs twice is parsed a second time.
Prints, per body size, the parse alone, the check alone, and the check on a body that does
repeat `"model"` in a nested object (the slow path: a second, stdlib, parse).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import orjson

from kvmigrate.proxy.body import _refuse_duplicate_keys


def body(messages: int, nested_model: bool = False) -> bytes:
    history = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": "a sentence of prose " * 12}
        for i in range(messages)
    ]
    data: dict[str, object] = {"messages": history, "stream": True, "model": "gpt-4o-mini"}
    if nested_model:
        data["metadata"] = {"model": "x"}
    return orjson.dumps(data)


def per_call_us(fn: Callable[[], object], seconds: float = 0.3) -> float:
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        calls += 1
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    print(f"{'body':>10} {'orjson parse':>14} {'dup check':>11} {'check, slow path':>17}")
    for messages in (2, 40, 400, 4000):
        raw, nested = body(messages), body(messages, nested_model=True)
        parse = per_call_us(lambda raw=raw: orjson.loads(raw))
        check = per_call_us(lambda raw=raw: _refuse_duplicate_keys(raw))
        slow = per_call_us(lambda raw=nested: _refuse_duplicate_keys(raw))
        print(f"{len(raw):>9}B {parse:>12.1f}us {check:>9.1f}us {slow:>15.1f}us")


if __name__ == "__main__":
    main()
