"""Every default of the config model is the value `config.yaml` documents for it.

`config.yaml` is the reference users read: a key it sets is shown with its default (unless
the table below says why the example differs), and a key it shows commented out is unset
by default. A default that moves alone (a timeout grown tenfold in the model while the file
still says 600) fails here, and so does a file edited alone. The defaults are read from a
config the loader fills in itself, not from the model's source.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from kvmigrate.config import parse_config
from kvmigrate.proxy.client_keys import MAX_VERDICTS

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "config.yaml"
ENV = {"OPENAI_API_KEY": "sk-x", "VLLM_API_KEY": "v", "KVMIGRATE_MASTER_KEY": "m",
       "KVMIGRATE_ADMIN_KEY": "a"}  # fmt: skip
# Only what the loader needs: every other value is its default.
MINIMAL = """
backends:
  hosted: {api_base: "https://api.openai.com/v1"}
  vllm: {api_base: "http://127.0.0.1:8000/v1"}
models:
  - {model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: llama}
"""
# Keys the example sets to something else than their default, and why.
EXAMPLE_NOT_DEFAULT = {
    "backends.vllm.connect_timeout": "the example's vLLM runs beside the proxy: 2 s, not 5",
    "rollout.gates.min_parity": "the reference config (and `init`) gates parity; a config "
    "written without it keeps the gate off, and `rollout status` says so",
}
# Keys the example shows commented out with an alternative to their default.
COMMENTED_ALTERNATIVES = {
    "backends.hosted.type": "azure, litellm and anthropic are shown against the default openai",
}
UNSET = (None, "", (), {})


def _fields(obj: Any) -> list[tuple[str, str]]:
    """(attribute, key in the file) of a config section's fields that have a default."""
    if isinstance(obj, msgspec.Struct):
        return [(f.name, f.encode_name) for f in msgspec.structs.fields(obj) if not f.required]
    if dataclasses.is_dataclass(obj):
        return [(f.name, f.name) for f in dataclasses.fields(obj)]
    return []


def _sections() -> Iterator[tuple[str, Any, Any]]:
    """(key path, the example's section, the defaults' section) of every section with
    defaults: server, each backend, rollout and its gates, record, cachecheck."""
    example = parse_config(EXAMPLE.read_text(), str(EXAMPLE), env=ENV)
    default = parse_config(MINIMAL, env={})
    for name in ("server", "rollout", "record", "cachecheck"):
        yield name, getattr(example, name), getattr(default, name)
    for name in ("gates", "auto_rollback"):
        yield f"rollout.{name}", getattr(example.rollout, name), getattr(default.rollout, name)
    for name in ("hosted", "vllm"):
        yield f"backends.{name}", example.backends[name], default.backends[name]


def _written(path: str) -> dict[str, Any]:
    """The keys the example file sets in the section at `path`, with their values."""
    section: Any = yaml.safe_load(EXAMPLE.read_text())
    for part in path.split("."):
        section = section.get(part) or {}
    return {k: v for k, v in section.items() if not isinstance(v, dict)}


def _commented(path: str) -> set[str]:
    """The keys the example shows commented out (`# key: value`) in the section at `path`:
    the lines between the section's header and the next line as little indented."""
    lines = EXAMPLE.read_text().splitlines()
    indent, start = -1, 0
    for part in path.split("."):
        pattern = re.compile(rf"^(\s*){re.escape(part)}:")
        start = next(
            i for i in range(start, len(lines))
            if (m := pattern.match(lines[i])) and len(m.group(1)) > indent
        )  # fmt: skip
        indent = len(lines[start]) - len(lines[start].lstrip())
    keys = set()
    for line in lines[start + 1 :]:
        stripped = line.lstrip()
        depth = len(line) - len(stripped)
        if stripped and not stripped.startswith("#") and depth <= indent:
            break
        if (m := re.match(r"#\s?([a-z_0-9]+):(?:\s|$)", stripped)) and depth == indent + 2:
            keys.add(m.group(1))
    return keys


def _rows() -> Iterator[Any]:
    for path, example, default in _sections():
        written = _written(path)
        commented = _commented(path)
        for attribute, key in _fields(default):
            if key in written:
                yield pytest.param(
                    f"{path}.{key}", getattr(example, attribute), getattr(default, attribute),
                    "set", id=f"{path}.{key}",
                )  # fmt: skip
            elif key in commented:
                yield pytest.param(
                    f"{path}.{key}", None, getattr(default, attribute), "commented",
                    id=f"{path}.{key}",
                )  # fmt: skip


ROWS = list(_rows())


@pytest.mark.parametrize(("key", "documented", "default", "how"), ROWS)
def test_a_default_is_the_value_config_yaml_documents(
    key: str, documented: Any, default: Any, how: str
) -> None:
    if how == "set":
        if key in EXAMPLE_NOT_DEFAULT:
            assert documented != default, f"{key} is its default now: drop it from the table"
        else:
            assert documented == default, f"{key}: config.yaml says {documented!r}"
    elif key not in COMMENTED_ALTERNATIVES:
        assert default in UNSET, f"{key} is shown commented out, but defaults to {default!r}"


def test_the_table_covers_the_settings_that_matter() -> None:
    """The rows include the values an operator tunes: a row lost to a parsing change
    of this test would otherwise pass in silence."""
    keys = {row.values[0] for row in ROWS}
    assert {
        "server.client_key_ttl_seconds",
        "server.max_body_bytes",
        "server.body_timeout_seconds",
        "server.header_timeout_seconds",
        "server.idle_timeout_seconds",
        "server.master_key",
        "server.admin_key",
        "server.metrics_key",
        "backends.hosted.connect_timeout",
        "backends.hosted.read_timeout",
        "backends.hosted.api_key",
        "backends.vllm.read_timeout",
        "backends.vllm.max_connections",
        "rollout.shadow_sample",
        "rollout.noise_sample",
        "rollout.pin_ttl_seconds",
        "rollout.gates.min_parity_samples",
        "rollout.gates.ttft_p95_slo_ms",
        "rollout.auto_rollback.max_error_rate",
        "record.content",
        "record.spool_max_mb",
        "record.hash_key",
        "cachecheck.ttl_seconds",
    } <= keys
    assert set(EXAMPLE_NOT_DEFAULT) | set(COMMENTED_ALTERNATIVES) <= keys


def test_the_security_page_states_the_key_verdicts_as_the_code_keeps_them() -> None:
    """docs/security.md's figures for the pass-through verdicts: their lifetime and count."""
    text = (ROOT / "docs" / "security.md").read_text()
    ttl = re.search(r"`server\.client_key_ttl_seconds` \((\d+) s by default\)", text)
    assert ttl is not None
    assert float(ttl.group(1)) == parse_config(MINIMAL, env={}).server.client_key_ttl_seconds
    kept = re.search(r"At most ([\d,]+) are kept", text)
    assert kept is not None
    assert int(kept.group(1).replace(",", "")) == MAX_VERDICTS
