"""No module outside `kvmigrate.vendor_internals` reaches into aiohttp's or prometheus-client's
private internals, or calls the C library: every such use is named there and checked by a
contract test (tests/private_api/), so an upgrade that moves one cannot break the proxy
unseen.

Besides ctypes imported nowhere else, two checks, as Python cannot say statically whose
object an attribute is read on:
  - no attribute named in an internals module's `PRIVATE_NAMES` is read or set on anything
    but `self`/`cls` (kvmigrate's own classes use some of the same names: `_loop`);
  - a kvmigrate class that subclasses a library class neither uses nor defines a private
    name of that library class, by `self`, `cls` or `super()`: what it overrides or shadows
    by accident would break as silently as what it reads.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

import kvmigrate
from kvmigrate.vendor_internals import aiohttp_internals, libc, prometheus_internals

PACKAGE_ROOT = Path(kvmigrate.__file__).parent
INTERNALS = PACKAGE_ROOT / "vendor_internals"
INTERNALS_MODULES = (aiohttp_internals, prometheus_internals, libc)
LIBRARIES = ("aiohttp", "prometheus_client", "multidict", "yarl")
PRIVATE_NAMES = {name for module in INTERNALS_MODULES for name in module.PRIVATE_NAMES}
# What Python itself puts in a class's dict: an ABC's registry, not the library's.
PYTHON_OWN = frozenset({"_abc_impl"})


def package_sources() -> Iterator[tuple[str, Path]]:
    """(dotted module name, path) of every kvmigrate module outside the internals package."""
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        if INTERNALS in path.parents:
            continue
        parts = list(path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join(parts), path


def _receiver_is_own(node: ast.Attribute) -> bool:
    value = node.value
    if isinstance(value, ast.Name):
        return value.id in ("self", "cls")
    return isinstance(value, ast.Call) and getattr(value.func, "id", None) == "super"


def test_private_names_are_touched_only_in_vendor_internals() -> None:
    found = []
    for _name, path in package_sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in PRIVATE_NAMES
                and not _receiver_is_own(node)
            ):
                found.append(f"{path.relative_to(PACKAGE_ROOT.parent)}:{node.lineno} .{node.attr}")
    assert not found, (
        "library internals touched outside kvmigrate/vendor_internals (add a named helper "
        "there, with its contract test): " + ", ".join(found)
    )


def _imported(path: Path) -> set[str]:
    """The top-level packages a module imports (anywhere in it)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.add((node.module or "").split(".")[0])
    return found


def test_ctypes_is_imported_only_in_vendor_internals() -> None:
    found = [str(path) for _name, path in package_sources() if "ctypes" in _imported(path)]
    assert not found, f"ctypes outside kvmigrate/vendor_internals/libc.py: {found}"


def _from_a_library(cls: type) -> bool:
    return cls.__module__.split(".")[0] in LIBRARIES


def library_subclasses() -> list[type]:
    """kvmigrate's classes (outside the internals package) with a library class among their
    bases: found in the modules that import a library, as loaded."""
    found = []
    for name, path in package_sources():
        if not _imported(path) & set(LIBRARIES):
            continue
        module = importlib.import_module(name)
        for _attr, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == name and any(map(_from_a_library, cls.__mro__[1:])):
                found.append(cls)
    return found


def _own_private_names(cls: type) -> set[str]:
    """Single-underscore names `cls`'s own body defines, or uses on `self`/`cls`/`super()`."""
    names = {name for name in vars(cls) if name.startswith("_") and not name.startswith("__")}
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _receiver_is_own(node):
            names.add(node.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")} - PYTHON_OWN


@cache
def _library_private_names(cls: type) -> frozenset[str]:
    """The private names a library class defines (its dict, its slots) or sets on `self`."""
    names = {name for name in vars(cls) if name.startswith("_") and not name.startswith("__")}
    slots = vars(cls).get("__slots__", ())
    names.update([slots] if isinstance(slots, str) else slots)
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # compiled (a C extension's class): its dict says it all
        source = ""
    if source:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Attribute) and _receiver_is_own(node):
                names.add(node.attr)
    return frozenset(n for n in names if n.startswith("_") and not n.startswith("__"))


def test_library_subclasses_are_found() -> None:
    """The scan sees the subclasses it is meant to check (a scan that finds none passes)."""
    names = {cls.__qualname__ for cls in library_subclasses()}
    assert {"EnvelopeRequestHandler", "EnvelopeServer", "ClientAnswer"} <= names, names


@pytest.mark.parametrize("cls", library_subclasses(), ids=lambda cls: cls.__qualname__)
def test_library_subclasses_touch_no_library_private_name(cls: type) -> None:
    own = _own_private_names(cls)
    for base in cls.__mro__[1:]:
        if not _from_a_library(base):
            continue
        clash = sorted(own & _library_private_names(base))
        assert not clash, (
            f"{cls.__module__}.{cls.__qualname__} uses or shadows {base.__module__}."
            f"{base.__qualname__}'s private {clash}: name it in kvmigrate/vendor_internals "
            "(with a contract test), or rename kvmigrate's own"
        )
