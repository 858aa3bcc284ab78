"""The schema in `model` put to work: read a declared section from the file, list its keys.

Each field is read by the `Section` getter its declared type calls for (a bool, a bounded
int or float, a `Literal` choice, a `Secret`, a nested section), with its declared default,
so the loader states only what no type can: derived fields and checks across keys.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeVar, get_args

from msgspec import NODEFAULT, Meta
from msgspec import inspect as mi

from kvmigrate.config.model import LIMITS, Config
from kvmigrate.config.reader import MISSING, Section
from kvmigrate.config.secret import Secret

T = TypeVar("T")
_NONE: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class _Field:
    """One declared field, as the reader needs it (msgspec's own description, worked out
    once: computing it costs more than reading a whole file)."""

    name: str
    key: str  # its name in the file
    kind: mi.Type  # the type, without `| None`
    optional: bool
    required: bool
    default: Any
    factory: Any
    low: Any
    high: Any
    max_length: int | None  # a string's: one word, at most this long
    choices: tuple[str, ...]  # a Literal's values, in the declared order

    def default_value(self) -> Any:
        return self.default if self.factory is NODEFAULT else self.factory()


def read_struct(
    s: Section,
    cls: type[T],
    given: Mapping[str, object] = _NONE,
    choices: Mapping[str, tuple[str, ...]] = _NONE,
) -> T:
    """`cls` from section `s`, then refuse the keys no field read. Fields in `given` are
    taken as they are; `choices` narrows a string field to names known only at load time."""
    values = dict(given)
    for field in _FIELDS[cls]:
        if field.name not in values:
            values[field.name] = _read(s, field, choices.get(field.name))
    s.finish()
    return cls(**values)


def read_field(s: Section, cls: type, name: str) -> Any:
    """One declared field of `cls`, read ahead of the others because they depend on it."""
    return _read(s, _field(cls, name), None)


def default_of(cls: type, name: str) -> Any:
    return _field(cls, name).default_value()


def _field(cls: type, name: str) -> _Field:
    return next(f for f in _FIELDS[cls] if f.name == name)


def _read(s: Section, field: _Field, allowed: tuple[str, ...] | None) -> Any:
    key, kind, low, high = field.key, field.kind, field.low, field.high
    default = field.default_value()
    if isinstance(kind, mi.BoolType):
        return s.boolean(key, default)
    if isinstance(kind, mi.IntType):
        return s.integer(key, default, low, high)
    if isinstance(kind, mi.FloatType):
        if field.optional:
            return s.optional_number(key, default, low, high)
        return s.number(key, default, low, high)
    if isinstance(kind, mi.LiteralType):
        return s.choice(key, default, field.choices)
    if isinstance(kind, mi.EnumType):  # a StrEnum (policies.modes.Mode): its values
        return kind.cls(s.choice(key, default, field.choices))
    if isinstance(kind, mi.StrType):
        if allowed is not None:
            return s.choice(key, default, allowed)
        if field.max_length is not None:
            return s.word(key, MISSING if field.required else default, field.max_length)
        return s.string(key) if field.required else s.string(key, default)
    if isinstance(kind, mi.CustomType) and kind.cls is Secret:
        return s.secret(key)
    if isinstance(kind, mi.StructType | mi.DataclassType):
        return read_struct(s.section(key), kind.cls)
    raise TypeError(f"no reader for {key}: {kind}; the loader must give it")


def _fields_of(root: type) -> Mapping[type, tuple[_Field, ...]]:
    """Every section reachable from `root`, with its fields."""
    found: dict[type, tuple[_Field, ...]] = {}
    pending = [mi.type_info(root)]
    while pending:
        info = pending.pop()
        if not isinstance(info, mi.StructType | mi.DataclassType) or info.cls in found:
            continue
        hints = getattr(info.cls, "__annotations__", {})
        limits = LIMITS.get(info.cls, _NONE)
        found[info.cls] = tuple(
            _describe(f, hints.get(f.name), limits.get(f.name)) for f in info.fields
        )
        for f in info.fields:  # the sections inside: fields, `| None`, dict values, items
            kind = f.type
            pending += [kind, *getattr(kind, "types", ())]
            pending += [getattr(kind, "value_type", kind), getattr(kind, "item_type", kind)]
    return MappingProxyType(found)


def _describe(field: mi.Field, hint: Any, limit: Meta | None) -> _Field:
    kind = field.type
    optional = isinstance(kind, mi.UnionType) and any(
        isinstance(t, mi.NoneType) for t in kind.types
    )
    if isinstance(kind, mi.UnionType):
        kind = next(t for t in kind.types if not isinstance(t, mi.NoneType))
    bounded = limit if limit is not None else kind
    return _Field(
        name=field.name,
        key=field.encode_name,
        kind=kind,
        optional=optional,
        required=field.required,
        default=field.default,
        factory=field.default_factory,
        low=getattr(bounded, "ge", None),
        high=getattr(bounded, "le", None),
        max_length=getattr(kind, "max_length", None),
        choices=_choices(kind, hint),
    )


def _choices(kind: mi.Type, hint: Any) -> tuple[str, ...]:
    """A Literal's or a StrEnum's values, as declared (msgspec sorts a Literal's): what a
    refusal lists."""
    if isinstance(kind, mi.LiteralType):
        return tuple(str(v) for v in get_args(hint) or kind.values)
    if isinstance(kind, mi.EnumType):
        return tuple(str(member.value) for member in kind.cls)
    return ()


_FIELDS = _fields_of(Config)


def config_keys() -> list[str]:
    """Every key path the loader accepts, as `rollout.gates.min_parity`; `*` stands for a
    name of your own (a backend, a litellm parameter) and `[]` for any item of a list."""
    return list(_keys(mi.type_info(Config), ""))


def _keys(kind: mi.Type, path: str) -> Iterator[str]:
    if isinstance(kind, mi.StructType | mi.DataclassType):
        not_keys = getattr(kind.cls, "not_keys", ())
        other = getattr(kind.cls, "other_keys", None)
        for field in kind.fields:
            if field.name == other:
                yield f"{path}.*"
            elif field.name not in not_keys:
                yield from _keys(field.type, f"{path}.{field.encode_name}".lstrip("."))
    elif isinstance(kind, mi.DictType):
        yield from _keys(kind.value_type, f"{path}.*")
    elif isinstance(kind, mi.VarTupleType | mi.ListType) and isinstance(
        kind.item_type, mi.StructType
    ):
        yield from _keys(kind.item_type, f"{path}[]")
    else:
        yield path
