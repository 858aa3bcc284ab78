"""`kvmigrate parity` output: a table for people, JSON for CI, and the threshold verdict."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from kvmigrate.parity.details import Changes
from kvmigrate.parity.noise import CONCLUSIVE, ComparatorParity
from kvmigrate.parity.offline import OfflineReport
from kvmigrate.parity.threshold import decide
from kvmigrate.policies.sequential import Verdict as GateVerdict

PASSED, FAILED, INCONCLUSIVE_EXIT = 0, 1, 3


@dataclass(frozen=True, slots=True)
class Verdict:
    name: str  # report_only, passed, failed, inconclusive
    exit_code: int
    line: str
    # Requests still needed for a verdict, when inconclusive and it can be told.
    more_requests: int | None = None


def verdict(report: OfflineReport, min_score: float | None) -> Verdict:
    """Without a threshold there is nothing to fail. With one, every conclusive comparator's
    noise-adjusted parity interval is judged against it (`threshold.decide`): passed when
    each lower bound reaches it, failed when one upper bound lies below it, otherwise
    inconclusive with its own exit code, never a pass."""
    if min_score is None:
        return Verdict("report_only", PASSED, "no --min-score given: report only")
    silent = report.unanswered_roles()
    if silent:
        return Verdict(
            "failed",
            FAILED,
            f"FAILED: the {' and the '.join(silent)} answered none of the requests usably "
            "(see the errors; is its api_base an OpenAI-compatible endpoint?)",
        )
    parity = report.parity
    scored = report.requests - report.skipped
    decision = decide(parity, min_score, scored) if parity.status == CONCLUSIVE else None
    if decision is None:
        return Verdict("inconclusive", INCONCLUSIVE_EXIT, f"INCONCLUSIVE: {parity.reason}")
    d = decision.deciding
    figure = (
        f"{d.name} parity {d.parity:.3f}, {parity.confidence:.0%} interval "
        f"[{d.interval.low:.3f}, {d.interval.high:.3f}]"
    )
    if decision.verdict is GateVerdict.FAILED:
        return Verdict(
            "failed", FAILED, f"FAILED: {figure}: upper bound < {min_score:g} (--min-score)"
        )
    if decision.verdict is GateVerdict.PASSED:
        return Verdict(
            "passed", PASSED, f"PASSED: lowest bound {figure} >= {min_score:g} (--min-score)"
        )
    more = decision.more_requests
    need = (
        f"about {more} more requests at these rates would decide"
        if more is not None
        else "the estimate sits on the threshold: more requests alone may never decide"
    )
    return Verdict(
        "inconclusive",
        INCONCLUSIVE_EXIT,
        f"INCONCLUSIVE: {figure} straddles {min_score:g} (--min-score); {need}",
        more,
    )


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:+.1f}"


def _row(c: ComparatorParity) -> str:
    interval = (
        f"[{_signed(c.excess_low)}, {_signed(c.excess_high)}]" if c.excess is not None else ""
    )
    parity = "-" if c.parity is None else f"{c.parity:.3f}"
    noise = f"{_pct(c.noise_rate)} ({c.noise_n})"
    return (
        f"{c.name:<14}{c.candidate_n:>6} {_pct(c.candidate_rate):>9} {noise:>14} "
        f"{_signed(c.excess):>7} {interval:<16} {parity:>7}  {c.status}"
    )


def render_text(report: OfflineReport, result: Verdict) -> str:
    p = report.parity
    lines = [
        f"requests: {report.requests} ({report.skipped} skipped); "
        f"scored pairs: {p.candidate_pairs} candidate, {p.noise_pairs} noise",
    ]
    for role, kinds in report.errors.items():
        if kinds:
            detail = ", ".join(f"{k}: {n}" for k, n in sorted(kinds.items()))
            lines.append(f"{role} errors: {sum(kinds.values())} ({detail})")
    for role in report.unanswered_roles():
        lines.append(f"{role}: no usable answer to any request; its agreement means nothing")
    for reason, count in sorted(report.skip_reasons.items()):
        lines.append(f"skipped {count}: {reason}")
    lines += [
        "",
        f"{'comparator':<14}{'pairs':>6} {'disagree':>9} {'noise (n)':>14} {'excess':>7} "
        f"{'95% CI':<16} {'parity':>7}  status",
    ]
    lines += [_row(c) for c in p.comparators]
    lines.append("")
    if p.parity is not None:
        lines.append(
            f"noise-adjusted parity {p.parity:.3f} "
            f"[{p.parity_low or 0.0:.3f}, {p.parity_high or 0.0:.3f}] ({p.reason})"
        )
    else:
        lines.append(f"noise-adjusted parity: {p.status} ({p.reason})")
    if p.raw_agreement is not None:
        noise = "-" if p.noise_agreement is None else f"{p.noise_agreement:.3f}"
        lines.append(f"raw agreement {p.raw_agreement:.3f}; primary self-agreement {noise}")
    lines.append(result.line)
    lines += _worst_lines(report)
    return "\n".join(lines)


def _worst_lines(report: OfflineReport) -> list[str]:
    if not report.worst:
        return []
    lines = ["", "worst examples (redacted):"]
    for name, examples in report.worst.items():
        for e in examples:
            lines.append(f"  {name}  {e.id}  score {e.score:.2f}  {e.detail}")
            lines.append(f"      request:   {e.request}")
            lines.append(f"      primary:   {e.primary}")
            lines.append(f"      candidate: {e.candidate}")
    return lines


def render_json(
    report: OfflineReport,
    result: Verdict,
    min_score: float | None,
    extra: dict[str, Any] | None = None,
) -> str:
    data = {
        **report.to_dict(),
        "min_score": min_score,
        "verdict": result.name,
        "exit_code": result.exit_code,
        "more_requests": result.more_requests,
        **(extra or {}),
    }
    return orjson.dumps(data, option=orjson.OPT_INDENT_2).decode()


def render_changes(changes: Changes, shown: int = 10) -> str:
    """Since the baseline run: the requests that diverge now and did not, and the fixed."""
    lines = ["", "Since the baseline:"]
    for label, ids in (
        ("new divergences", changes.new_divergences),
        ("fixed", changes.fixed),
        ("still diverged", changes.still_diverged),
    ):
        listed = ", ".join(ids[:shown]) + (
            f" (+{len(ids) - shown} more)" if len(ids) > shown else ""
        )
        lines.append(f"  {label:<16} {len(ids):>4}  {listed}".rstrip())
    return "\n".join(lines)
