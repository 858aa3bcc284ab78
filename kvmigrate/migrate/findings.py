"""What a scan reports: findings about client code and configs, and files it could not handle."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Action(StrEnum):
    """What kvmigrate does about one finding."""

    REWRITE = "rewrite"  # a literal URL (or key) that this run changes
    NEEDS_HUMAN = "needs_human"  # a value built at run time, or a reference to a secret
    FLAGGED = "flagged"  # a client that a URL change cannot move (Azure, Bedrock)
    ENV_SWITCH = "env_switch"  # a client with no URL: an environment variable is the switch


class Severity(StrEnum):
    SKIPPED = "skipped"  # deliberately not scanned (vendored, binary, huge, symlink)
    ERROR = "error"  # meant to be scanned, but could not be read or parsed


@dataclass(frozen=True, slots=True)
class Finding:
    path: str  # relative to the scanned root, with forward slashes
    line: int  # 1-based; 0 when the finding is about the whole file
    kind: str  # the file kind: python, js, env, yaml
    framework: str  # openai, langchain, docker-compose, kubernetes, ...
    action: Action
    message: str
    old: str | None = None  # the value found, when it is a literal
    new: str | None = None  # the value it becomes (rewrite) or the proposed change (flagged)

    def to_json(self) -> dict[str, object]:
        return {
            "path": self.path,
            "line": self.line,
            "kind": self.kind,
            "framework": self.framework,
            "action": self.action.value,
            "message": self.message,
            "old": self.old,
            "new": self.new,
        }


@dataclass(frozen=True, slots=True)
class Problem:
    path: str
    severity: Severity
    reason: str  # a short stable word: binary, too-large, symlink, encoding, parse, ...
    detail: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "path": self.path,
            "severity": self.severity.value,
            "reason": self.reason,
            "detail": self.detail,
        }


@dataclass(frozen=True, slots=True)
class Edit:
    """Replace text[start:end] (character offsets into the decoded file) with `new`."""

    start: int
    end: int
    new: str


@dataclass(slots=True)
class ScanResult:
    """What one rewriter found in one file: the edits to make and everything worth telling."""

    edits: list[Edit] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    # Old key values this file holds: a diff shown in a terminal or a CI log masks them.
    secrets: set[str] = field(default_factory=set)
    # "dotenv", "docker-compose", "kubernetes", "helm", "github-actions": a file that sets the
    # environment where code runs, named in the advice for clients that set no URL.
    deploy_kind: str | None = None


class ParseFailure(Exception):
    """A file of a kind we scan that its parser refused; it is reported and left untouched."""
