"""Write docs/configuration.md from the config model, so the reference cannot drift.

python scripts/config_reference.py          # rewrite docs/configuration.md
python scripts/config_reference.py --check  # exit 1 when docs/configuration.md is out of date

Every key the loader accepts (`kvmigrate.config.config_keys()`), in its section, with the
type, default and bounds the schema declares (`kvmigrate/config/model.py`, and the gates'
fields in `kvmigrate/policies/gate_model.py` and `gates.py`), and the comment the model
gives the field: the lines just above it or at its end, or its line in the class docstring.
"""

from __future__ import annotations

import enum
import inspect
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, get_args, get_type_hints

from msgspec import NODEFAULT
from msgspec import inspect as mi

from kvmigrate.config.model import LIMITS, Config
from kvmigrate.config.secret import Secret

TARGET = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"

INTRO = """\
# Configuration reference

Generated from the config model by `scripts/config_reference.py` (a test fails when it is
stale). `config.yaml` at the repository root is the same reference as a commented example.

- Secrets are never written in the file: `os.environ/NAME` reads one from the environment,
  as in LiteLLM, wherever the type below is *secret* (and in `litellm_params`). A variable
  that is not set stops the proxy at start with its name.
- Unknown keys, bad values and a key written twice in one mapping (which YAML would
  otherwise drop silently; a key next to a merge, `<<: *base`, overrides it as YAML means)
  are refused at start with the file, the key path and the reason. `kvmigrate config check`
  runs the same load:

    ```
    Error: config.yaml: rollout.shadow_sampel: unknown key (did you mean 'shadow_sample'?)
    Error: config.yaml: rollout.percent: duplicate key (lines 86 and 89): {duplicate}
    ```

- The schema is declared once, in `kvmigrate/config/model.py` (types, defaults, bounds);
  `kvmigrate.config.config_keys()` lists every key path it accepts. In a path below, `*` is
  a name of your own (a backend, a header) and `[]` any item of a list.
- A word-like string (a URL, a host, a name) refuses any whitespace or control character.
- The rollout values seed the rollout store the first time a proxy opens it; after that
  `kvmigrate rollout` changes the stored state, and every running proxy applies a change
  within a second.
"""

SECTIONS = {
    "server": "The proxy's listener, its keys and its limits on clients.",
    "backends": "The upstream APIs, each under a name of your choosing (`hosted`, `vllm`).",
    "models": "The model names clients send, and what each backend calls that model.",
    "rollout": "Who answers, who gets a copy, and the rollout's steps, gates and auto-rollback.",
    "record": "The records of every upstream call: the evidence of reports, gates and parity.",
    "cachecheck": "The online cache-buster detector: what in the prompts breaks prefix reuse.",
    "cohorts": "Parts of a model's traffic that move on a rollout of their own.",
    "gpu": "GPU and KV use of the candidates, scraped in the background, for the report.",
}


def render() -> str:
    duplicate = "a mapping keeps only the last one; remove the other"
    parts = [INTRO.format(duplicate=duplicate)]
    section = ""
    for path, info, owner, key in _leaves(mi.type_info(Config), "", None, ""):
        top = path.split(".")[0].split("[")[0]
        if top != section:
            section = top
            parts.append(f"\n## `{section}`\n\n{SECTIONS[section]}\n")
            parts.append("| key | type | default | meaning |\n|---|---|---|---|")
        parts.append(_row(path, info, owner, key))
    return "\n".join(parts) + "\n"


def _leaves(
    kind: mi.Type, path: str, owner: type | None, key: str
) -> Iterator[tuple[str, mi.Type | mi.Field, type | None, str]]:
    """(key path, field, class that declares it, field name) of every key, as config_keys()
    walks them."""
    if isinstance(kind, mi.StructType | mi.DataclassType):
        not_keys = getattr(kind.cls, "not_keys", ())
        other = getattr(kind.cls, "other_keys", None)
        for field in kind.fields:
            sub = f"{path}.{field.encode_name}".lstrip(".")
            inner = _unwrap(field.type)
            if field.name == other:
                yield f"{path}.*", field, kind.cls, field.name
            elif field.name in not_keys:
                continue
            elif _is_section(inner):
                yield from _leaves(inner, sub, kind.cls, field.name)
            elif isinstance(inner, mi.DictType):  # names of your own: `litellm_params.*`
                yield f"{sub}.*", field, kind.cls, field.name
            else:
                yield sub, field, kind.cls, field.name
    elif isinstance(kind, mi.DictType):
        yield from _leaves(kind.value_type, f"{path}.*", owner, key)
    elif isinstance(kind, mi.VarTupleType | mi.ListType):
        yield from _leaves(kind.item_type, f"{path}[]", owner, key)


def _is_section(kind: mi.Type) -> bool:
    if isinstance(kind, mi.StructType | mi.DataclassType):
        return True
    if isinstance(kind, mi.DictType):
        return _is_section(kind.value_type)
    if isinstance(kind, mi.VarTupleType | mi.ListType):
        return isinstance(kind.item_type, mi.StructType)
    return False


def _unwrap(kind: mi.Type) -> mi.Type:
    if isinstance(kind, mi.UnionType):
        return next(t for t in kind.types if not isinstance(t, mi.NoneType))
    return kind


def _row(path: str, field: Any, owner: type | None, name: str) -> str:
    assert owner is not None
    kind = field.type
    optional = isinstance(kind, mi.UnionType) and any(
        isinstance(t, mi.NoneType) for t in kind.types
    )
    kind = _unwrap(kind)
    limit = LIMITS.get(owner, {}).get(name)
    bounded = limit if limit is not None else kind
    type_text = _type(kind, owner, name)
    low, high = getattr(bounded, "ge", None), getattr(bounded, "le", None)
    if low is not None and high is not None:
        type_text += f", {low:g} to {high:g}"
    elif low is not None:
        type_text += f", ≥ {low:g}"
    max_length = getattr(kind, "max_length", None)
    if max_length is not None:
        type_text += f", one word of at most {max_length} characters"
    default = _default(field, optional)
    meaning = _comments(owner).get(name, "")
    return f"| `{path}` | {type_text} | {default} | {_cell(meaning)} |"


def _type(kind: mi.Type, owner: type, name: str) -> str:
    if isinstance(kind, mi.BoolType):
        return "bool"
    if isinstance(kind, mi.IntType):
        return "integer"
    if isinstance(kind, mi.FloatType):
        return "number"
    if isinstance(kind, mi.LiteralType):
        hint = get_type_hints(owner, include_extras=False).get(name)
        values = [v for v in get_args(hint) if v is not None] or list(kind.values)
        if values and all(isinstance(v, str) for v in values):
            return "one of " + ", ".join(f"`{v}`" for v in values)
        return "one of " + ", ".join(f"`{v}`" for v in _flatten_literal(hint))
    if isinstance(kind, mi.EnumType):
        return "one of " + ", ".join(f"`{m.value}`" for m in kind.cls)
    if isinstance(kind, mi.StrType):
        return "string"
    if isinstance(kind, mi.CustomType) and kind.cls is Secret:
        return "secret"
    if isinstance(kind, mi.VarTupleType | mi.ListType):
        return f"list of {_type(_unwrap(kind.item_type), owner, name)}"
    if isinstance(kind, mi.DictType):  # a key of your own: its value's type
        return _type(_unwrap(kind.value_type), owner, name)
    if isinstance(kind, mi.AnyType) or (isinstance(kind, mi.CustomType) and kind.cls is object):
        return "any"
    return type(kind).__name__


def _flatten_literal(hint: Any) -> list[object]:
    found: list[object] = []
    for arg in get_args(hint):
        found += _flatten_literal(arg) if get_args(arg) else [arg]
    return [v for v in found if v is not None and v is not type(None)]


def _default(field: Any, optional: bool) -> str:
    if field.required:
        return "required"
    if field.default_factory is not NODEFAULT:
        value = field.default_factory()
        if isinstance(value, Mapping) and not value:
            return "`{}`"
        if hasattr(value, "__struct_fields__") or hasattr(value, "__dataclass_fields__"):
            return "(section)"
    else:
        value = field.default
    if value is None:
        return "unset" if optional else "none"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, tuple):
        return "`[" + ", ".join(_number(v) for v in value) + "]`" if value else "`[]`"
    if isinstance(value, float | int):
        return f"`{_number(value)}`"
    if value == "":
        return '`""`'
    return f"`{value}`"


def _number(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, int) and value >= 1024 * 1024 and value % (1024 * 1024) == 0:
        return f"{value} ({value // (1024 * 1024)} MiB)"
    return str(value)


_FIELD = re.compile(r"^(\s+)(\w+)\s*:\s*[^=]")
_DOC_ENTRY = re.compile(r"^([a-z0-9_]+(?:\s*/\s*[a-z0-9_]+)*):\s+(.*)$")


def _comments(cls: type) -> dict[str, str]:
    """Each field's comment in the class's source: the comment lines just above it and the
    one at the end of its line; else its entry in the class docstring (`name: text`, or
    `a / b: text` for two fields at once)."""
    found = _docstring_entries(cls)
    pending: list[str] = []
    indent = None
    for line in inspect.getsource(cls).splitlines()[1:]:
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        match = _FIELD.match(line)
        if match and (indent is None or match.group(1) == indent):
            indent = match.group(1)
            name = match.group(2)
            trailing = _trailing_comment(line)
            text = " ".join([*pending, trailing]).strip()
            if text:
                found[name] = text
        pending = []
    return found


def _trailing_comment(line: str) -> str:
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#":
            return line[i + 1 :].strip()
    return ""


def _docstring_entries(cls: type) -> dict[str, str]:
    doc = inspect.getdoc(cls) or ""
    entries: dict[str, str] = {}
    names: list[str] = []
    for line in doc.splitlines():
        match = _DOC_ENTRY.match(line)
        if match:
            names = [n.strip() for n in match.group(1).split("/")]
            for name in names:
                entries[name] = match.group(2).strip()
        elif line.startswith(" ") and names:
            for name in names:
                entries[name] += " " + line.strip()
        else:
            names = []
    return entries


def _cell(text: str) -> str:
    text = text.replace("|", "\\|")
    if re.match(r"\w+:", text):  # `azure: ...`, a backend type's own field
        return text
    return text[:1].upper() + text[1:]


if __name__ == "__main__":
    text = render()
    if "--check" in sys.argv:
        sys.exit(0 if TARGET.exists() and TARGET.read_text() == text else 1)
    TARGET.write_text(text)
    print(f"wrote {TARGET}")
