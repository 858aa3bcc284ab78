"""The bodies of the `/admin/rollout` API as types, shared by the proxy and `RemoteRollout`.

Requests are msgspec Structs that refuse unknown fields; answers are the controller's own
values (`RolloutStatus`, `ChangeOutcome`, `RolloutEvent`), decoded by msgspec on the client,
so the CLI reads attributes whichever way it reached the rollout.
"""

from __future__ import annotations

import re
from typing import Annotated, TypeVar

import msgspec
from msgspec import Meta
from msgspec import inspect as mi

from kvmigrate.logtext import quoted
from kvmigrate.policies.gates import GateResult
from kvmigrate.policies.modes import Mode
from kvmigrate.rollout.controller import ACTOR_MAX_CHARS, REASON_MAX_CHARS, RolloutStatus
from kvmigrate.rollout.state import RolloutEvent

T = TypeVar("T")
# Refused at decoding, before a megabyte of reason is stored or echoed.
Reason = Annotated[str, Meta(max_length=REASON_MAX_CHARS)]
Actor = Annotated[str, Meta(max_length=ACTOR_MAX_CHARS)]


class RolloutChange(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """POST /admin/rollout: `percent` and/or `mode`, applied as one change (a promotion
    when the share the candidate serves rises)."""

    percent: Annotated[float, Meta(ge=0.0, le=100.0)] | None = None
    mode: Mode | None = None
    force: bool = False
    reason: Reason = ""
    actor: Actor = ""
    # Which cohort (a model_name or a named cohort); required when the config has several.
    cohort: str | None = None
    # With `percent`: which of the cohort's candidates gets the share.
    candidate: str | None = None
    # Refuse unless the cohort's state is still at this version (`rollout auto`).
    expected_version: int | None = None


class RollbackRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """POST /admin/rollback."""

    reason: Reason = ""
    actor: Actor = ""
    cohort: str | None = None


class RolloutHistory(msgspec.Struct, frozen=True):
    """GET /admin/rollout/history."""

    events: list[RolloutEvent]


class CohortStatuses(msgspec.Struct, frozen=True):
    """GET /admin/rollout/cohorts: every cohort's status, in the config's order."""

    cohorts: list[RolloutStatus]


class Refusal(msgspec.Struct, frozen=True):
    """An error answer: the OpenAI envelope, with the gates' verdicts when they refused."""

    class Error(msgspec.Struct, frozen=True):
        message: str

    error: Error
    gates: list[GateResult] = []


class BodyError(ValueError):
    """A request body that does not fit its type: what to tell the client, and the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def decode_request(raw: bytes, cls: type[T]) -> T:
    """`cls` from a request body (empty: every default), or `BodyError` saying what is wrong."""
    try:
        return msgspec.json.decode(raw or b"{}", type=cls)
    except msgspec.ValidationError as exc:
        raise _body_error(str(exc), cls) from None
    except msgspec.DecodeError:
        raise BodyError("the body is not valid JSON") from None


def _body_error(problem: str, cls: type) -> BodyError:
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    fields = {f.name: f.type for f in info.fields}
    at = re.search(r"at `\$\.(\w+)`", problem)
    if at and at.group(1) in fields:
        name = at.group(1)
        return BodyError(f"{name} must be {_expected(fields[name])}", param=name)
    unknown = re.search(r"unknown field `(.*)`", problem)
    if unknown:
        known = ", ".join(fields)
        name = quoted(unknown.group(1))  # the client's own key: bounded
        return BodyError(f"unknown field {name}; known: {known}", name[1:-1])
    return BodyError("the body must be a JSON object")


def _expected(kind: mi.Type) -> str:
    if isinstance(kind, mi.UnionType):
        kind = next(t for t in kind.types if not isinstance(t, mi.NoneType))
    if isinstance(kind, mi.FloatType | mi.IntType):
        if kind.ge is not None and kind.le is not None:
            return f"a number between {kind.ge:g} and {kind.le:g}"
        return "a number"
    if isinstance(kind, mi.LiteralType):
        return " or ".join(f'"{v}"' for v in kind.values)
    if isinstance(kind, mi.EnumType):
        return " or ".join(f'"{m.value}"' for m in kind.cls)
    if isinstance(kind, mi.BoolType):
        return "true or false"
    if isinstance(kind, mi.StrType) and kind.max_length is not None:
        return f"a string of at most {kind.max_length} characters"
    return "a string"
