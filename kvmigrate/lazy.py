"""Code named as `"module:attribute"`, imported only when it is needed.

A store factory (`recorder.store`, `rollout.store`) defines the interface its
implementations build on, so it cannot import them as it loads: it names each one by URL
scheme, and the one a URL asks for is imported then. A worker process's parent names the
child's main the same way, when that main imports the parent's module.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def load(target: str) -> Any:
    """The attribute `target` names (`"package.module:name"`), its module imported now."""
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def url_scheme(url: str) -> str:
    """`sqlite` for `sqlite:///x.db`; empty for a URL without `://`."""
    return url.split("://", 1)[0] if "://" in url else ""


def implementation(url: str, by_scheme: Mapping[str, str]) -> Any:
    """What `by_scheme` names for `url`'s scheme, imported now; None for a scheme it does
    not name."""
    target = by_scheme.get(url_scheme(url))
    return None if target is None else load(target)


def package_exports(package: str, by_name: Mapping[str, str]) -> Callable[[str], Any]:
    """A package's module-level `__getattr__` for the names it re-exports, each `by_name`
    to the submodule that defines it, imported on first use. Importing one light submodule
    (`kvmigrate.emulator.tokens`) then no longer loads the heavy ones beside it (the
    emulator's aiohttp server), which a command that never serves paid for at every start."""

    def attribute(name: str) -> Any:
        module = by_name.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return attribute
