"""A plan, an apply or a revert as text for people and as JSON for CI."""

from __future__ import annotations

from pathlib import Path

from kvmigrate.logtext import printable
from kvmigrate.masked_lines import mask_credentials
from kvmigrate.migrate.apply import BACKUP_DIR, ApplyResult, RevertResult, revert_command
from kvmigrate.migrate.findings import Action, Finding, Severity
from kvmigrate.migrate.plan import Plan

JSON_VERSION = 1
_LINE_LIMIT = 100_000  # a line of a minified file is cut in the text report, never in a file
_SECTIONS = (
    (Action.NEEDS_HUMAN, "Needs a human"),
    (Action.FLAGGED, "Flagged, not rewritten"),
    (Action.ENV_SWITCH, "Set no URL: the environment is the switch"),
)


def plan_json(
    plan: Plan,
    *,
    mode: str,
    exit_code: int,
    applied: ApplyResult | None = None,
    error: str | None = None,
) -> dict[str, object]:
    return {
        "version": JSON_VERSION,
        "mode": mode,  # dry-run | apply
        "root": str(plan.root),
        "proxy_url": plan.options.proxy_url,
        "summary": plan.summary(),
        "changes": [{"path": c.path, "edits": c.edits, "diff": c.diff()} for c in plan.changes],
        "findings": [_masked(f.to_json()) for f in plan.findings],
        "problems": [_masked(p.to_json()) for p in plan.problems],
        "notes": [mask_credentials(note) for note in plan.notes],
        "backup_id": applied.backup_id if applied else None,
        "error": error,
        "exit_code": exit_code,
    }


def revert_json(
    result: RevertResult | None, *, error: str | None, exit_code: int
) -> dict[str, object]:
    return {
        "version": JSON_VERSION,
        "mode": "revert",
        "backup_id": result.backup_id if result else None,
        "restored": result.restored if result else [],
        "unchanged": result.unchanged if result else [],
        "error": error,
        "exit_code": exit_code,
    }


def _masked(fields: dict[str, object]) -> dict[str, object]:
    """A finding or a problem as the report shows it: a parser's error quotes the line it
    failed on, and a URL may carry a password; no credential is printed."""
    return {k: mask_credentials(v) if isinstance(v, str) else v for k, v in fields.items()}


def _anthropic_root(plan: Plan) -> str:
    """Said only when an Anthropic client or variable was found: its URL has no /v1."""
    if not any("anthropic" in f.message.lower() for f in plan.findings):
        return ""
    return f" (Anthropic clients: {plan.options.anthropic_url})"


def plan_text(
    plan: Plan,
    *,
    applied: ApplyResult | None,
    show_diff: bool,
    apply_command: str | None = None,
    backup_dir: Path | None = None,
) -> str:
    """`apply_command`: the exact command that applies this dry run (the options it was
    made with); None after an apply was attempted."""
    lines: list[str] = []
    if show_diff:
        lines.extend(c.diff().rstrip("\n") for c in plan.changes)
    diffs = len(lines)
    summary = plan.summary()
    verb = "changed" if applied else "would change"
    lines.append(
        f"Scanned {summary['files_scanned']} file(s) under {plan.root}: "
        f"{summary['files_changed']} {verb} ({summary['edits']} edit(s)); "
        f"proxy {plan.options.proxy_url}" + _anthropic_root(plan)
    )
    counts = summary["findings"]
    assert isinstance(counts, dict)
    lines.append("Findings: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    for action, title in _SECTIONS:
        chosen = [f for f in plan.findings if f.action is action]
        if chosen:
            lines.append(f"{title}:")
            lines.extend(_finding_line(f) for f in chosen)
    lines.extend(f"Note: {note}" for note in plan.notes)
    errors = plan.errors
    if errors:
        lines.append("Errors (files left untouched):")
        lines.extend(f"  {p.path}: {p.reason}: {p.detail}" for p in errors)
    skipped = [p for p in plan.problems if p.severity is Severity.SKIPPED]
    if skipped:
        lines.append("Skipped:")
        lines.extend(
            f"  {p.path} ({p.reason}{': ' + p.detail if p.detail else ''})" for p in skipped
        )
    lines.append(_closing(plan, applied, apply_command, backup_dir))
    # The diff is masked already; findings, notes and parser errors quote the files too.
    return for_terminal(
        "\n".join(lines[:diffs] + [mask_credentials(line) for line in lines[diffs:]])
    )


def _finding_line(finding: Finding) -> str:
    line = f"  {finding.path}:{finding.line} [{finding.framework}] {finding.message}"
    if finding.action is Action.FLAGGED and finding.new:
        line += f"\n      proposed: {finding.new}"
    return line


def _closing(
    plan: Plan, applied: ApplyResult | None, apply_command: str | None, backup_dir: Path | None
) -> str:
    if applied is not None and applied.backup_id:
        where = (
            f"in {backup_dir}"
            if backup_dir is not None
            else f"in {BACKUP_DIR}/ (git-ignored by .kvmigrate/.gitignore: it holds your "
            "files as they were, secrets included)"
        )
        undo = revert_command(plan.root, applied.backup_id, backup_dir)
        return f"Applied. Backup {applied.backup_id} {where}; undo with: {undo}"
    if not plan.changes:
        return "Nothing to rewrite."
    if apply_command is None:
        return "Nothing written."
    return f"Dry run: nothing written. Apply with: {apply_command}"


def revert_text(result: RevertResult) -> str:
    lines = [
        f"Reverted backup {result.backup_id}: {len(result.restored)} file(s) restored; the "
        "backup's copies of them are removed (its manifest stays, marked reverted)."
    ]
    lines.extend(f"  restored {path}" for path in result.restored)
    lines.extend(f"  already original {path}" for path in result.unchanged)
    return for_terminal("\n".join(lines))


def for_terminal(text: str) -> str:
    """Text quoting a tree's files, as a terminal may show it. A scanned repository is
    anyone's: an escape sequence, a lone carriage return or a bidi control in a line (as
    in "Trojan Source") would make the diff a reviewer reads differ from the bytes written.
    Each is shown escaped; tabs stay, and a CRLF line's CR goes (it shows as nothing)."""
    lines = (line.removesuffix("\r") for line in text.split("\n"))
    return "\n".join(printable(line, _LINE_LIMIT, keep="\t") for line in lines)
