"""What refusing duplicate top-level keys costs a request (issue 21 item 7), before and
after the scans went through `kvmigrate.bytescan` (the C library's memmem).

    .venv/bin/python benchmarks/duplicate_key_scan.py

`parse_body` parses each body once with orjson. The duplicate check looks for `"model"`
spelled twice and for a letter written as an escape (`\\u0065`), in one memory-speed pass
each; only a body where one of them turns up is parsed a second time (the slow path).
Prints, per body size and kind (prose; a tool's coloured output, whose `\\u001b` escapes
the letter check must look past), the parse alone, the check as it was (`bytes.find`,
`rfind`, `in` and a regular expression over the body), the check now, and the check on a
body that does repeat `"model"` in a nested object.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import orjson

from kvmigrate.proxy.body import _ESCAPED_ASCII, _refuse_duplicate_keys

PROSE = "a sentence of prose " * 12
COLOURED = "\x1b[31mFAIL\x1b[0m tests/test_api.py::test_retry - AssertionError\n" * 4


def body(messages: int, content: str, nested_model: bool = False) -> bytes:
    history = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": content} for i in range(messages)
    ]
    # The OpenAI SDKs write `messages` before `model`: a scan meets it at the end.
    data: dict[str, object] = {"messages": history, "stream": True, "model": "gpt-4o-mini"}
    if nested_model:
        data["metadata"] = {"model": "x"}
    return orjson.dumps(data)


def check_before(raw: bytes) -> bool:
    """The check as it was before bytescan: whether the cheap test passed."""
    first = raw.find(b'"model"')
    return first == raw.rfind(b'"model"') and not (b"\\u00" in raw and _ESCAPED_ASCII.search(raw))


def per_call_us(fn: Callable[[], object], seconds: float = 0.3) -> float:
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        calls += 1
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    kind, size, parse, before, now, slow = (
        "kind",
        "body",
        "orjson parse",
        "check before",
        "check now",
        "slow path",
    )
    print(f"{kind:>8} {size:>10} {parse:>13} {before:>13} {now:>10} {slow:>10}")
    for kind, content in (("prose", PROSE), ("coloured", COLOURED)):
        for messages in (2, 40, 400, 4000):
            raw, nested = body(messages, content), body(messages, content, nested_model=True)
            parse = per_call_us(lambda raw=raw: orjson.loads(raw))
            before = per_call_us(lambda raw=raw: check_before(raw))
            now = per_call_us(lambda raw=raw: _refuse_duplicate_keys(raw, False))
            slow = per_call_us(lambda raw=nested: _refuse_duplicate_keys(raw, False))
            print(
                f"{kind:>8} {len(raw):>9}B {parse:>11.1f}us {before:>11.1f}us {now:>8.1f}us "
                f"{slow:>8.1f}us"
            )


if __name__ == "__main__":
    main()
