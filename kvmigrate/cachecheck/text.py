"""The `kvmigrate cachecheck` report as text and as JSON."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvmigrate.cachecheck.analyze import Conversation
from kvmigrate.cachecheck.classes import DESCRIPTIONS
from kvmigrate.cachecheck.compare import TurnCheck
from kvmigrate.cachecheck.waste import Summary

Checked = Sequence[tuple[Conversation, list[TurnCheck]]]


def render_json(checked: Checked, summary: Summary, skipped: int) -> dict[str, Any]:
    return {
        "summary": summary.as_dict(),
        "skipped_lines": skipped,
        "conversations": [
            {"id": c.id, "turns": [t.as_dict() for t in checks]} for c, checks in checked
        ],
    }


def render_text(checked: Checked, summary: Summary, skipped: int, shown: int = 20) -> str:
    lines: list[str] = []
    for conversation, checks in list(checked)[:shown]:
        lines += _turn_table(conversation.id, checks)
    if len(checked) > shown:
        lines.append(f"({len(checked) - shown} more conversations not shown; use --json)\n")
    lines += _reuse_by_turn(summary)
    lines += _busters(summary)
    lines += _waste(summary, skipped)
    return "\n".join(lines).rstrip() + "\n"


def _turn_table(name: str, checks: list[TurnCheck]) -> list[str]:
    lines = [f"conversation {name}", "  turn  prompt tok  reused tok  reuse  break"]
    for c in checks:
        reuse = "     -" if c.turn == 1 else f"{c.ratio:6.0%}"
        reused = "-" if c.turn == 1 else str(c.reused_tokens)
        where = ""
        if c.brk is not None:
            loc = c.brk.location
            at = "tools" if loc.message is None else f"msg {loc.message} ({loc.role})"
            where = f"{c.brk.cls.value} at {at} {loc.field}@{loc.offset}"
        lines.append(f"  {c.turn:4d}  {c.prompt_tokens:10d}  {reused:>10}  {reuse}  {where}")
    return [*lines, ""]


def _reuse_by_turn(summary: Summary) -> list[str]:
    if not summary.by_turn:
        return []
    lines = ["prefix reuse by turn (share of what an append-only agent would reuse)"]
    for turn, ratios in sorted(summary.by_turn.items()):
        mean = sum(ratios) / len(ratios)
        bar = "#" * round(mean * 20)
        lines.append(f"  turn {turn:3d}  {mean:6.1%}  {bar:<20}  ({len(ratios)} requests)")
    return [*lines, ""]


def _busters(summary: Summary) -> list[str]:
    ranked = summary.ranked()
    if not ranked:
        return ["no cache busters: every turn extends the previous one", ""]
    lines = ["top cache busters by tokens lost"]
    cost = summary.cost
    for rank, b in enumerate(ranked, start=1):
        tag = " (deliberate)" if b.example.deliberate else ""
        label = f" `{b.label}`" if b.label else ""
        lines += [
            f"  {rank}. {b.cls.value}{tag}: {DESCRIPTIONS[b.cls]}",
            f"     where: {b.role} {b.where}{label}; {b.breaks} breaks in "
            f"{len(b.conversations)} conversations; {b.tokens_lost} tokens lost, "
            f"{cost.seconds(b.tokens_lost) * 1000:.0f} ms TTFT",
            f"     before: {b.example.before}",
            f"     after:  {b.example.after}",
            f"     fix: {b.example.fix}",
        ]
    return [*lines, ""]


def _waste(summary: Summary, skipped: int) -> list[str]:
    breaks, lost = summary.lost(False)
    deliberate, deliberate_lost = summary.lost(True)
    cost = summary.cost
    money = cost.dollars(lost)
    lines = [
        "estimated waste",
        f"  {summary.conversations} conversations, {summary.requests} requests "
        f"({summary.compared} after a first turn); overall prefix reuse {summary.reuse_ratio:.1%}",
        f"  cache busters: {breaks} breaks, {lost} tokens re-prefilled, "
        f"{cost.seconds(lost):.3f} s TTFT at {cost.prefill_tokens_per_s:,.0f} tok/s"
        + (f", ${money:.4f} at ${cost.price_per_mtok}/M tokens" if money is not None else ""),
    ]
    if deliberate:
        lines.append(
            f"  deliberate truncation/summaries: {deliberate} breaks, {deliberate_lost} tokens"
        )
    if skipped:
        lines.append(f"  skipped {skipped} lines that are not chat requests")
    return lines
