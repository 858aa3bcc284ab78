"""The package's layers hold: import-linter's contracts in pyproject.toml (`[tool.importlinter]`)
pass over the checkout, with every import that runs counted, those inside functions too.

The contracts: each part of kvmigrate imports only the layers below its own (every part is
placed: a new one must be), no cycle between the parts of any package, and the policies and
wire formats import no server, client, store or config. Here, besides: the policies import
only the standard library, the wire formats and two numeric helpers.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    """The graph import-linter checks (every import that runs, those in functions too;
    external packages as leaves), of the kvmigrate these tests import."""
    return grimp.build_graph(
        "kvmigrate",
        include_external_packages=True,
        exclude_type_checking_imports=True,
        cache_dir=None,
    )


def test_the_contracts_hold() -> None:
    path = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]  # this checkout first
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    proc = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Contracts: 3 kept, 0 broken." in proc.stdout, proc.stdout


def test_an_import_inside_a_function_is_an_edge(graph: grimp.ImportGraph) -> None:
    # The gates' evidence loads the records queries only when a gate first asks.
    imported = graph.find_modules_directly_imported_by("kvmigrate.recorder.evidence")
    assert "kvmigrate.recorder.queries" in imported


POLICIES_MAY_IMPORT = (
    "kvmigrate.policies",
    "kvmigrate.wire",
    "kvmigrate.intervals",
    "kvmigrate.percentile",
)
# What the wire formats parse with: the one third-party package either imports.
THIRD_PARTY = {"orjson", "msgspec"}


def test_the_policies_import_only_the_standard_library_and_the_wire_formats(
    graph: grimp.ImportGraph,
) -> None:
    pure = {
        m
        for m in graph.modules
        if any(m == p or m.startswith(p + ".") for p in POLICIES_MAY_IMPORT)
    }
    outside = {
        (source, target)
        for source in pure
        for target in graph.find_modules_directly_imported_by(source)
        if target not in pure
        and target.split(".")[0] not in sys.stdlib_module_names
        and target not in THIRD_PARTY
    }
    assert outside == set()
    assert {"kvmigrate.policies.gates", "kvmigrate.wire.sse"} <= pure  # the walk found them
