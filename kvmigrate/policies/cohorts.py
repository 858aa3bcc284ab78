"""Which cohort a request belongs to: pure, over the facts the proxy already has.

A cohort is a model group, optionally narrowed by a selector: header values, `metadata`
values, or the label of the client key that was used. A model's named cohorts are tried in
the config's order and the first whose every condition holds wins; a request none matches
belongs to the model's own cohort, named after the model. So every request belongs to
exactly one cohort, and only names from the config ever come out (bounded metric labels).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class Selector:
    """One named cohort's conditions. `key_label`: the cohort matches only requests whose
    client key carries this label (the caller looks the label up; the key is never here)."""

    cohort: str
    headers: tuple[tuple[str, str], ...] = ()
    metadata: tuple[tuple[str, str], ...] = ()
    key_label: str | None = None

    @property
    def needs_key(self) -> bool:
        return self.key_label is not None


@dataclass(frozen=True, slots=True)
class CohortTable:
    """Each model's selectors, in the config's order. A model without any is absent, so the
    common case costs one dict lookup."""

    selectors: Mapping[str, tuple[Selector, ...]] = field(
        default_factory=lambda: MappingProxyType({})
    )

    def needs_key(self, model: str) -> bool:
        return any(s.needs_key for s in self.selectors.get(model, ()))


def resolve_cohort(
    table: CohortTable,
    model: str,
    headers: Mapping[str, str],
    metadata: object = None,
    key_label: str | None = None,
) -> str:
    """The cohort of a request for `model`. `headers` is looked up by the configured names
    (the proxy passes its case-insensitive header mapping); `metadata` is the request body's
    `metadata` value, whatever its type."""
    selectors = table.selectors.get(model)
    if not selectors:
        return model
    values = metadata if isinstance(metadata, Mapping) else {}
    for selector in selectors:
        if (
            (selector.key_label is None or selector.key_label == key_label)
            and all(headers.get(name) == want for name, want in selector.headers)
            and all(values.get(name) == want for name, want in selector.metadata)
        ):
            return selector.cohort
    return model
