"""The proxy's side of cohorts: the config's selectors as a `CohortTable`, and the label of
the client key a request used, looked up without ever keeping the key."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from multidict import CIMultiDictProxy

from kvmigrate.config import Config, Secret
from kvmigrate.policies.cohorts import CohortTable, Selector, resolve_cohort
from kvmigrate.proxy.headers import bearer_token


def key_labels(config: Config) -> dict[str, Secret]:
    """Each distinct client key of the cohorts, labelled by the first cohort that names it.
    Cohorts that share a key share its label: a request carries one key, so a label per
    cohort matched only the first of them, and the others never got their traffic."""
    labels: dict[str, Secret] = {}
    for c in config.cohorts:
        key = c.match.client_key
        if key is not None and key not in labels.values():
            labels[c.name] = key
    return labels


def cohort_table(config: Config) -> CohortTable:
    labels = key_labels(config)
    selectors: dict[str, list[Selector]] = {}
    for c in config.cohorts:
        key = c.match.client_key
        label = next((n for n, k in labels.items() if k == key), None) if key else None
        selectors.setdefault(c.model, []).append(
            Selector(c.name, tuple(c.match.header.items()), tuple(c.match.metadata.items()), label)
        )
    return CohortTable(MappingProxyType({m: tuple(s) for m, s in selectors.items()}))


class CohortResolver:
    def __init__(self, config: Config) -> None:
        self.table = cohort_table(config)
        # label -> key: one label per distinct key (see `key_labels`).
        self._keys: Mapping[str, Secret] = key_labels(config)

    def resolve(
        self, model: str, headers: CIMultiDictProxy[str], body: Mapping[str, object]
    ) -> str:
        if model not in self.table.selectors:
            return model  # the common case: no named cohort for this model
        label = self.key_label(headers) if self.table.needs_key(model) else None
        return resolve_cohort(self.table, model, headers, body.get("metadata"), label)

    def key_label(self, headers: CIMultiDictProxy[str]) -> str | None:
        token = bearer_token(headers)
        if token is None:
            return None
        return next((label for label, key in self._keys.items() if key.matches(token)), None)
