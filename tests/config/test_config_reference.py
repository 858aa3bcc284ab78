"""`config.yaml` is "the commented reference of every key": every key the loader accepts
appears in it, set or commented out, in its section.

The accepted keys are found by the loader's own behaviour, not by reading its code: each
field of the loaded config objects is offered to the loader as a key of its section, and a
key is accepted when the loader does not call it unknown. So the test holds whatever shape
the loader takes inside.

docs/configuration.md, generated from the config model (scripts/config_reference.py), is
checked here too: current, and listing exactly the keys the loader accepts."""

from __future__ import annotations

import copy
import dataclasses
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from kvmigrate.config import ConfigError, config_keys, parse_config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "config.yaml"
ENV = {"OPENAI_API_KEY": "sk-x", "VLLM_API_KEY": "v", "KVMIGRATE_MASTER_KEY": "m",
       "KVMIGRATE_ADMIN_KEY": "a"}  # fmt: skip


def _fields(obj: Any) -> list[str]:
    names = getattr(type(obj), "__struct_fields__", None)  # msgspec
    if names is not None:
        return list(names)
    if dataclasses.is_dataclass(obj):
        return [f.name for f in dataclasses.fields(obj)]
    return []


def _sections(obj: Any, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(key path, config object) of every mapping section the loaded config has."""
    yield path, obj
    for name in _fields(obj):
        value = getattr(obj, name)
        if _fields(value):
            yield from _sections(value, (*path, name))
        elif isinstance(value, dict) and all(_fields(v) for v in value.values()):
            for key, item in value.items():  # backends: one section per backend
                yield from _sections(item, (*path, name, key))


def _accepted(data: dict[str, Any], path: tuple[str, ...], key: str) -> bool:
    probe = copy.deepcopy(data)
    section = probe
    for part in path:
        section = section.setdefault(part, {})
    if key in section:
        return True
    section[key] = None
    try:
        parse_config(yaml.safe_dump(probe), "probe.yaml", env=ENV)
    except ConfigError as exc:
        return "unknown key" not in str(exc)
    return True


def _block(lines: list[str], path: tuple[str, ...]) -> list[str]:
    """The lines of config.yaml under a key path (by indentation), comments included."""
    start, indent = 0, -1
    for part in path:
        for i in range(start, len(lines)):
            line = lines[i]
            depth = len(line) - len(line.lstrip())
            if depth > indent and re.match(rf"\s*{re.escape(part)}:", line):
                start, indent = i + 1, depth
                break
        else:
            raise AssertionError(f"config.yaml has no section {'.'.join(path)}")
    block = []
    for line in lines[start:]:
        depth = len(line) - len(line.lstrip())
        if line.strip() and depth <= indent and not line.lstrip().startswith("#"):
            break
        block.append(line)
    return block


def test_the_example_lists_every_key_the_loader_accepts() -> None:
    text = EXAMPLE.read_text()
    data = yaml.safe_load(text)
    config = parse_config(text, str(EXAMPLE), env=ENV)
    lines = text.splitlines()
    missing, probed = [], 0
    for path, obj in _sections(config, ()):
        # A backend key is documented once, on whichever backend the example shows it.
        where = path[:1] if path[:1] == ("backends",) else path
        block = "\n".join(_block(lines, where)) if where else text
        for key in _fields(obj):
            if _fields(getattr(obj, key)) or not _accepted(data, path, key):
                continue
            probed += 1
            if not re.search(rf"^\s*(#\s*)?{re.escape(key)}:", block, re.MULTILINE):
                missing.append(".".join((*path, key)))
    assert probed > 30  # the probe found the keys, not nothing
    assert missing == [], missing


def test_configuration_page_is_current() -> None:
    """docs/configuration.md is generated from the config model, as docs/cli.md is from the
    CLI: a key, type, default, bound or field comment changed without it fails here."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "config_reference.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, (
        "docs/configuration.md is stale: run python scripts/config_reference.py"
    )


def test_configuration_page_lists_exactly_the_accepted_keys() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text()
    listed = re.findall(r"^\| `([^`]+)` \|", page, re.M)
    assert listed == config_keys()
