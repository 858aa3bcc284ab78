"""Reads the `cohorts:` section: named parts of a model group's traffic, each with its own
rollout. A model's remaining traffic is its own cohort, named after the model, so
a config without this section has one cohort per model, as before."""

from __future__ import annotations

from collections.abc import Callable

from kvmigrate.config.errors import shown
from kvmigrate.config.model import NAME_MAX_CHARS, CohortConfig, CohortMatch, ModelRoute
from kvmigrate.config.reader import Section

StepsReader = Callable[[Section, tuple[float, ...]], tuple[float, ...]]


def read_cohorts(
    root: Section, models: tuple[ModelRoute, ...], read_steps: StepsReader, primary: str
) -> tuple[CohortConfig, ...]:
    for index, model in enumerate(models):
        if primary in model.candidates:
            where = root.child("models", None).child(index, {})
            raise where.error("candidates", f"{shown(primary)} is rollout.primary, not a candidate")
    items = root.raw("cohorts", [])
    if not isinstance(items, list):
        raise root.error("cohorts", "expected a list of cohorts (name, model, match)")
    model_names = {m.model_name for m in models}
    cohorts: list[CohortConfig] = []
    for index, item in enumerate(items):
        s = root.child("cohorts", None).child(index, item)
        cohort = _cohort(s, model_names, read_steps)
        taken = model_names | {c.name for c in cohorts}
        if cohort.name in taken:
            taken_name = s.quoted("name", cohort.name)
            raise s.error("name", f"{taken_name} is already a model's or a cohort's name")
        cohorts.append(cohort)
    return tuple(cohorts)


def read_candidates(s: Section, served: dict[str, str]) -> tuple[str, ...]:
    """`models[].candidates`: backends of this model (keys of its entry), each at most once.
    Whether one is the primary is checked against the rollout section, read before."""
    raw = s.raw("candidates", [])
    if not isinstance(raw, list):
        raise s.error("candidates", "expected a list of backend names, e.g. [vllm-bf16, vllm-fp8]")
    names: list[str] = []
    for index, name in enumerate(raw):
        if not isinstance(name, str) or name not in served:
            known = ", ".join(served)
            raise s.error(
                f"candidates[{index}]",
                f"{shown(name)} is not a backend of this model; its: {known}",
            )
        if name in names:
            raise s.error(f"candidates[{index}]", f"{shown(name)} is listed twice")
        names.append(name)
    return tuple(names)


def _cohort(s: Section, models: set[str], read_steps: StepsReader) -> CohortConfig:
    name = s.name("name", NAME_MAX_CHARS)
    if not name.strip():
        raise s.error("name", "is empty")
    model = s.string("model")
    if model not in models:
        known = ", ".join(sorted(models)) or "none"
        raise s.error("model", f"not a models[].model_name; known: {known}")
    match = _match(s.section("match"))
    if not (match.header or match.metadata or match.client_key):
        raise s.error("match", "give at least one of header, metadata, client_key")
    steps = read_steps(s, ()) or None
    bake = s.optional_number("bake_seconds", None, 0.0)
    s.finish()
    return CohortConfig(str(name), str(model), match, steps, bake)


def _match(s: Section) -> CohortMatch:
    header = _strings(s, "header")
    metadata = _strings(s, "metadata")
    client_key = s.secret("client_key")
    s.finish()
    return CohortMatch(header, metadata, client_key)


def _strings(s: Section, key: str) -> dict[str, str]:
    part = s.section(key)
    values = {}
    for name in part.names():
        value = part.string(name)
        values[name] = str(value)
    return values
