"""Scan a tree into a Plan: the exact bytes each file would get, and everything worth telling.

A plan is pure data; nothing is written until `apply.apply_plan` is given one.
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from kvmigrate.masked_lines import mask_credentials
from kvmigrate.migrate.env_rewriter import scan_env
from kvmigrate.migrate.findings import Action, Finding, ParseFailure, Problem, ScanResult, Severity
from kvmigrate.migrate.js_rewriter import scan_js
from kvmigrate.migrate.python_rewriter import scan_python
from kvmigrate.migrate.text import NotUtf8, OverlappingEdits, decode, splice
from kvmigrate.migrate.values import ANTHROPIC_URL_VARS, OPENAI_URL_VARS, RewriteOptions
from kvmigrate.migrate.walk import Candidate, walk

Scanner = Callable[[str, str, RewriteOptions], ScanResult]
_CONTAINER_KINDS = frozenset({"docker-compose", "kubernetes", "helm"})
_CODE_KINDS = frozenset({"python", "js"})


def _scanner(kind: str) -> Scanner:
    if kind == "python":
        return scan_python
    if kind == "js":
        return scan_js
    if kind == "env":
        return scan_env
    from kvmigrate.migrate.yaml_rewriter import scan_yaml  # ruamel is only needed for YAML

    return scan_yaml


@dataclass(frozen=True, slots=True)
class FileChange:
    path: str  # relative to the plan's root, forward slashes
    old: bytes
    new: bytes
    edits: int
    secrets: frozenset[str] = frozenset()

    def diff(self) -> str:
        old = self.old.decode("utf-8", "replace").splitlines(keepends=True)
        new = self.new.decode("utf-8", "replace").splitlines(keepends=True)
        lines = difflib.unified_diff(old, new, f"a/{self.path}", f"b/{self.path}")
        text = "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
                       for line in lines)  # fmt: skip
        for secret in self.secrets:
            if len(secret) >= 4:  # masking a one-letter value would mangle the whole diff
                text = text.replace(secret, "********")
        # Keys the rewriters do not know (AZURE_OPENAI_API_KEY, OPENAI_API_KEY_2, a
        # password) show up as context lines: every credential's value is masked.
        return mask_credentials(text)


@dataclass
class Plan:
    root: Path
    options: RewriteOptions
    changes: list[FileChange] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    scanned: int = 0

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity is Severity.ERROR]

    def summary(self) -> dict[str, object]:
        by_action = Counter(f.action.value for f in self.findings)
        return {
            "files_scanned": self.scanned,
            "files_changed": len(self.changes),
            "edits": sum(c.edits for c in self.changes),
            "findings": {a.value: by_action.get(a.value, 0) for a in Action},
            "errors": len(self.errors),
            "skipped": len(self.problems) - len(self.errors),
        }


def build_plan(root: Path, options: RewriteOptions) -> Plan:
    root = root.resolve()
    plan = Plan(root, options)
    deploy: dict[str, str] = {}
    for candidate in walk(root, plan.problems):
        plan.scanned += 1
        result = _scan_file(plan, candidate)
        if result is not None and result.deploy_kind:
            deploy[candidate.rel] = result.deploy_kind
    plan.notes.extend(_advice(plan, deploy))
    return plan


def _scan_file(plan: Plan, candidate: Candidate) -> ScanResult | None:
    def fail(reason: str, detail: str) -> ScanResult | None:
        plan.problems.append(Problem(candidate.rel, Severity.ERROR, reason, detail))
        return None

    try:
        raw = candidate.path.read_bytes()
        decoded = decode(raw)
    except OSError as exc:
        return fail("unreadable", str(exc))
    except NotUtf8 as exc:
        return fail("encoding", str(exc))
    scan = _scanner(candidate.kind)
    try:
        result = scan(decoded.text, candidate.rel, plan.options)
        new_text = splice(decoded.text, result.edits)
        # Self-check: the rewritten file must scan clean, or the rewrite is not trusted.
        if result.edits and scan(new_text, candidate.rel, plan.options).edits:
            return fail("self-check", "the rewritten file would be rewritten again; untouched")
    except ParseFailure as exc:
        return fail("parse", str(exc))
    except (RecursionError, MemoryError):
        # One file nested too deep for the parser must not lose the report on the others.
        return fail("too-deep", "nested too deeply to parse safely; check this file by hand")
    except OverlappingEdits as exc:
        return fail("shared-value", str(exc))
    except ValueError as exc:
        return fail("parse", f"{type(exc).__name__}: {exc}")
    plan.findings.extend(dict.fromkeys(result.findings))  # a YAML alias reports a node twice
    new = decoded.encode(new_text)
    if new != raw:
        edits = len(set(result.edits))
        # The proxy key is a secret too: masked on the `+` lines that write it.
        secrets = result.secrets | ({plan.options.proxy_key} if plan.options.proxy_key else set())
        plan.changes.append(FileChange(candidate.rel, raw, new, edits, frozenset(secrets)))
    return result


def _advice(plan: Plan, deploy: dict[str, str]) -> list[str]:
    proxy = plan.options.proxy_url
    code = [f for f in plan.findings if f.action is Action.ENV_SWITCH and f.kind in _CODE_KINDS]
    anthropic = [f for f in code if _mentions(f, ANTHROPIC_URL_VARS)]
    notes = _switch_notes(
        plan, deploy, [f for f in code if f not in anthropic], OPENAI_URL_VARS,
        "follow OPENAI_BASE_URL (LangChain, LlamaIndex and LiteLLM read OPENAI_API_BASE)",
        f"OPENAI_BASE_URL={proxy} (and OPENAI_API_BASE)",
    )  # fmt: skip
    notes += _switch_notes(
        plan, deploy, anthropic, ANTHROPIC_URL_VARS, "are Anthropic clients: they follow "
        "ANTHROPIC_BASE_URL", f"ANTHROPIC_BASE_URL={plan.options.anthropic_url} (no /v1: "
        "the SDK appends /v1/messages)",
    )  # fmt: skip
    host = urlsplit(proxy).hostname or ""
    rewritten = {f.framework for f in plan.findings if f.action is Action.REWRITE}
    in_containers = rewritten & _CONTAINER_KINDS
    if in_containers and (host in ("localhost", "::1") or host.startswith("127.")):
        notes.append(
            f"{proxy} is a loopback address, but {', '.join(sorted(in_containers))} files were "
            "rewritten: inside a container that is the container itself. Use --proxy-url with "
            "the proxy's service name (http://kvmigrate:4000/v1) unless it runs as a sidecar."
        )
    return notes


def _switch_notes(
    plan: Plan,
    deploy: dict[str, str],
    code: list[Finding],
    variables: tuple[str, ...],
    follow: str,
    setting: str,
) -> list[str]:
    """Advice for clients that set no URL: which deployment files set their variable."""
    if not code:
        return []
    sets = sorted({f.path for f in plan.findings if f.path in deploy and _mentions(f, variables)})
    where = f"these files set it: {', '.join(sets)}" if sets else "no file here sets it"
    notes = [f"{len(code)} client(s) set no base URL and {follow}: {where}."]
    others = sorted(set(deploy) - set(sets))
    if others:
        notes.append(
            f"Set {setting} where the code runs; deployment files found that do not set it: "
            f"{', '.join(others)}."
        )
    return notes


def _mentions(finding: Finding, variables: tuple[str, ...]) -> bool:
    return any(var in finding.message for var in variables)
