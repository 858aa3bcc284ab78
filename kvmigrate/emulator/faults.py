"""Fault injection: from random rates in the settings, or aimed at one request by a header.

Header `x-emulator-fault`: a comma list of `[target:]fault[=arg]`. A fault with a target
applies only when the target equals this emulator's name (`--name`, default the profile), so a
proxy test can fail only the candidate backend. Faults:

    500, 503, any 4xx/5xx   answer that status in the profile's error envelope
    429[=S]                 answer 429 with `Retry-After: S` (default 1)
    slow-first-byte=S       wait S seconds before the first byte
    stall[=S]               stop mid-stream (or mid-body) for S seconds, default forever
    disconnect              close the connection mid-stream (or mid-body)
    malformed-json          a 200 whose body is not valid JSON (garbage SSE when streamed)
    malformed-sse           garbage SSE lines mid-stream (invalid JSON when not streamed)
    redirect                a 302 to another address, as a misrouted gateway answers
    wrong-framing           a JSON body to a request that asked to stream, an event stream
                            to one that did not
    no-line-ends            a 200 event stream of bytes with no line end
    hang                    never answer

Example: `x-emulator-fault: vllm:503, hosted:slow-first-byte=0.5`.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, replace

from kvmigrate.emulator.settings import FaultRates

FAULT_HEADER = "x-emulator-fault"
_STATUS = re.compile(r"^[45]\d\d$")


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """The faults one request gets. `names` lists them for the fault counter."""

    status: int | None = None
    retry_after_s: float = 1.0
    slow_first_byte_s: float = 0.0
    stall_s: float | None = None
    disconnect: bool = False
    malformed: bool = False
    hang: bool = False
    misframed: str | None = None  # "redirect", "wrong-framing" or "no-line-ends"
    names: tuple[str, ...] = ()

    @property
    def mid_body(self) -> bool:
        """Whether a fault strikes after the response has started."""
        return self.disconnect or self.malformed or self.stall_s is not None


NO_FAULTS = FaultPlan()
MISFRAMED = ("redirect", "wrong-framing", "no-line-ends")


def _seconds(name: str, arg: str | None, default: float | None) -> float:
    if arg is None:
        if default is None:
            raise ValueError(f"fault {name!r} needs a value in seconds, as {name}=1.5")
        return default
    try:
        value = float(arg)
    except ValueError:
        raise ValueError(f"fault {name!r} takes seconds, not {arg!r}") from None
    if value < 0 or math.isnan(value):
        raise ValueError(f"fault {name!r} takes a non-negative number of seconds")
    return value


def _apply(plan: FaultPlan, name: str, arg: str | None) -> FaultPlan:
    plan = replace(plan, names=(*plan.names, name))
    if _STATUS.match(name):
        retry = _seconds(name, arg, 1.0) if name == "429" else plan.retry_after_s
        return replace(plan, status=int(name), retry_after_s=retry)
    if name == "slow-first-byte":
        return replace(plan, slow_first_byte_s=_seconds(name, arg, None))
    if name == "stall":
        return replace(plan, stall_s=_seconds(name, arg, math.inf))
    if name == "disconnect":
        return replace(plan, disconnect=True)
    if name in ("malformed-json", "malformed-sse"):
        return replace(plan, malformed=True)
    if name == "hang":
        return replace(plan, hang=True)
    if name in MISFRAMED:
        return replace(plan, misframed=name)
    raise ValueError(f"unknown emulator fault {name!r}")


def parse_fault_header(value: str, instance: str) -> FaultPlan:
    """The faults of one `x-emulator-fault` header value aimed at `instance`.

    Raises ValueError on an unknown fault, whichever emulator it targets, so a typo in a
    test fails loudly instead of silently injecting nothing."""
    plan = NO_FAULTS
    for item in value.split(","):
        item = item.strip()
        if not item:
            continue
        spec, _, arg = item.partition("=")
        target, _, name = spec.rpartition(":")
        name = name.strip().lower()
        seconds = arg.strip() if arg else None
        _apply(NO_FAULTS, name, seconds)  # validates faults aimed elsewhere too
        if target.strip() and target.strip() != instance:
            continue
        plan = _apply(plan, name, seconds)
    return plan


def draw_faults(rates: FaultRates, rng: random.Random) -> FaultPlan:
    """The random faults of one request, one independent draw per rate."""
    plan = NO_FAULTS
    if rates.slow_first_byte_s > 0:
        plan = _apply(plan, "slow-first-byte", str(rates.slow_first_byte_s))
    draws = (
        (rates.error_rate, "500", None),
        (rates.rate_limit_rate, "429", None),
        (rates.disconnect_rate, "disconnect", None),
        (rates.stall_rate, "stall", str(rates.stall_s)),
        (rates.malformed_rate, "malformed-json", None),
    )
    for rate, name, arg in draws:
        if rate > 0 and rng.random() < rate:
            plan = _apply(plan, name, arg)
    return plan


def combine(first: FaultPlan, second: FaultPlan) -> FaultPlan:
    """Header faults (`second`) override random ones where both set the same thing."""
    if not second.names:
        return first
    if not first.names:
        return second
    merged = second
    for name in first.names:
        if name not in second.names:
            merged = replace(merged, names=(*merged.names, name))
    return replace(
        merged,
        status=second.status if second.status is not None else first.status,
        slow_first_byte_s=max(first.slow_first_byte_s, second.slow_first_byte_s),
        stall_s=second.stall_s if second.stall_s is not None else first.stall_s,
        disconnect=first.disconnect or second.disconnect,
        malformed=first.malformed or second.malformed,
        hang=first.hang or second.hang,
        misframed=second.misframed or first.misframed,
    )
