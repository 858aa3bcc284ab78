"""Name the cause of one prefix break: where the first difference is, and what changed there."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from kvmigrate.cachecheck.classes import DELIBERATE, BreakClass, fix_for
from kvmigrate.cachecheck.excerpt import window
from kvmigrate.cachecheck.render import TOOLS, Rendering, Segment
from kvmigrate.cachecheck.volatile import volatile_class

_SPACE = re.compile(r"\s+")


@dataclass(frozen=True, slots=True)
class Location:
    """The first difference: message index (None for the tool list), its role, the field
    (`content`, `tool_calls[0].function.arguments`, `tools[2]`, ...), the character offset
    in that field's value, and the character offset in the whole rendering."""

    message: int | None
    role: str
    field: str
    offset: int
    char: int


@dataclass(frozen=True, slots=True)
class Break:
    cls: BreakClass
    location: Location
    before: str  # redacted window of what an append-only agent would have sent
    after: str  # redacted window of what was sent
    fix: str
    label: str = ""  # the text that introduces a changing value, e.g. `Current time:`
    detail: str = ""

    @property
    def deliberate(self) -> bool:
        return self.cls in DELIBERATE

    def as_dict(self) -> dict[str, Any]:
        loc = self.location
        return {
            "class": self.cls.value,
            "deliberate": self.deliberate,
            "message": loc.message,
            "role": loc.role,
            "field": loc.field,
            "offset": loc.offset,
            "char": loc.char,
            "label": self.label,
            "detail": self.detail,
            "before": self.before,
            "after": self.after,
            "fix": self.fix,
        }


def classify(expected: Rendering, actual: Rendering, index: int, char: int) -> Break:
    """`index` is the first segment whose text differs, `char` the common prefix in chars."""
    old = expected.segments[index]
    new = actual.segments[index] if index < len(actual.segments) else None
    if old.message == TOOLS or (new is not None and new.message == TOOLS):
        return _tools_break(expected, actual, old, new, char)
    history = _history_break(expected, actual, old, char)
    if history is not None:
        return history
    if new is None or (new.message, new.role, new.field) != (old.message, old.role, old.field):
        return _structural_break(old, new, char)
    return _field_break(old, new, char)


def _field_break(old: Segment, new: Segment, char: int) -> Break:
    offset = common_prefix(old.value, new.value)
    label = ""
    if new.field.endswith(".arguments") and _json_equal(old.value, new.value):
        cls = BreakClass.TOOL_ARGS
    elif _SPACE.sub("", old.value) == _SPACE.sub("", new.value):
        cls = BreakClass.WHITESPACE
    elif (volatile := volatile_class(old.value, new.value, offset)) is not None:
        cls, label = volatile
    elif old.role in ("system", "developer"):
        cls = BreakClass.SYSTEM_PROMPT
    else:
        cls = BreakClass.EDITED
    return Break(
        cls,
        Location(old.message, old.role, old.field, offset, char),
        window(old.value, offset),
        window(new.value, offset),
        fix_for(cls, label, old.role, old.field),
        label,
        f"message {old.message} ({old.role}) {old.field} differs at char {offset}",
    )


def _tools_break(
    expected: Rendering, actual: Rendering, old: Segment, new: Segment | None, char: int
) -> Break:
    before, after = expected.tool_values(), actual.tool_values()
    same_field = new is not None and new.field == old.field and old.field.startswith("tools[")
    offset = common_prefix(old.value, new.value) if same_field and new is not None else 0
    label = ""
    if sorted(map(_canonical, before)) == sorted(map(_canonical, after)):
        cls = BreakClass.TOOLS_REORDERED
    elif same_field and new is not None and (v := volatile_class(old.value, new.value, offset)):
        cls, label = v
    else:
        cls = BreakClass.TOOLS_CHANGED
    names = f"{_tool_names(before)} -> {_tool_names(after)}"
    return Break(
        cls,
        Location(None, "system", old.field, offset, char),
        window(old.value, offset),
        window(new.value if new is not None else "", offset),
        fix_for(cls, label, "system", old.field),
        label,
        f"tools {names}",
    )


def _history_break(expected: Rendering, actual: Rendering, old: Segment, char: int) -> Break | None:
    """Messages dropped (a sliding window) or replaced by fewer (a summary): the latest
    expected messages reappear contiguously, but earlier than an append-only agent puts them."""
    first = old.message
    em, am = expected.message_keys(), actual.message_keys()
    for k in range(first + 1, len(em)):
        tail = em[k:]
        for j in range(first, k):
            if am[j : j + 1] != tail[:1] or am[j : j + len(tail)] != tail:
                continue
            # A dropped message never comes back after the kept tail; if one does, the tail
            # matched a repeat (an agent answering "ok" twice), not a truncation.
            dropped = set(em[first:k])
            if not any(m in dropped for m in am[j + len(tail) :]):
                return _truncated(old, char, k - first, j - first)
    sizes_e, sizes_a = _message_sizes(expected), _message_sizes(actual)
    if len(am) <= len(em) and sum(sizes_a[first:]) < sum(sizes_e[first:]):
        return _truncated(old, char, len(em) - first, min(1, len(am) - first))
    return None


def _truncated(old: Segment, char: int, dropped: int, replaced_by: int) -> Break:
    how = f"summarised into {replaced_by}" if replaced_by else "dropped"
    return Break(
        BreakClass.TRUNCATED,
        Location(old.message, old.role, "messages", 0, char),
        f"{dropped} message(s) from #{old.message}",
        how,
        fix_for(BreakClass.TRUNCATED, "", old.role, "messages"),
        detail=f"{dropped} message(s) from message {old.message} on were {how}",
    )


def _structural_break(old: Segment, new: Segment | None, char: int) -> Break:
    """A message inserted, removed or given another role or shape (a new field)."""
    if new is None:
        detail = f"message {old.message} ({old.role}) missing"
    elif new.message != old.message or new.role != old.role:
        detail = f"message {old.message} was {old.role}, now {new.role}"
    else:
        detail = f"message {old.message} ({old.role}): field {old.field} became {new.field}"
    return Break(
        BreakClass.EDITED,
        Location(old.message, old.role, old.field, 0, char),
        window(old.text, 0),
        window(new.text if new is not None else "", 0),
        fix_for(BreakClass.EDITED, "", old.role, old.field),
        detail=detail,
    )


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix, by halving (C-speed slice compares)."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _message_sizes(rendering: Rendering) -> list[int]:
    sizes = [0] * rendering.messages
    for segment in rendering.segments:
        if segment.message >= 0:
            sizes[segment.message] += len(segment.text)
    return sizes


def _json_equal(a: str, b: str) -> bool:
    try:
        return bool(json.loads(a) == json.loads(b))
    except ValueError:
        return False


def _canonical(value: str) -> str:
    try:
        return json.dumps(json.loads(value), sort_keys=True, separators=(",", ":"))
    except ValueError:
        return value


def _tool_names(values: list[str]) -> str:
    names = []
    for value in values:
        try:
            tool = json.loads(value)
        except ValueError:
            tool = None
        function = tool.get("function") if isinstance(tool, dict) else None
        # A chat tool names its function; an Anthropic tool is named at the top.
        holder = function if isinstance(function, dict) else tool
        name = holder.get("name") if isinstance(holder, dict) else None
        names.append(str(name) if name else "?")
    return "[" + ", ".join(names) + "]"
