"""Shared pytest fixtures. Each section belongs to one part of the test bed; keep them apart."""

from __future__ import annotations

import gc
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from kvmigrate.testbed.vllm_server import VllmServer


# --- real vLLM (kvmigrate.testbed) ------------------------------------------------------------
# One real vLLM CPU server for the whole session: starting one takes ~30 s, so tests share
# it. The first run ever also installs the vLLM venv (~2 min) and builds the tiny model
# (< 1 s); both are cached under ~/.cache/kvmigrate. Tests that use it are marked `vllm`;
# skip them with `-m "not vllm"`.


@pytest.fixture(scope="session")
def real_vllm() -> Iterator[VllmServer]:
    """A running vLLM serving the tiny model as `tiny`, prefix caching on, hermes tools."""
    from kvmigrate.testbed.tiny_model import ensure_tiny_model
    from kvmigrate.testbed.vllm_server import VllmServer
    from kvmigrate.testbed.vllm_venv import ensure_vllm_venv

    python = ensure_vllm_venv()
    model = ensure_tiny_model("tiny", python)
    with VllmServer(model, served_model_name="tiny", python=python) as server:
        yield server


# --- end real vLLM ----------------------------------------------------------------------------


# --- leaked resources -------------------------------------------------------------------------
# A client or socket a test forgets to close is freed when Python's cycle collector next runs a
# full collection, which in a big test process can be hundreds of tests later: its
# ResourceWarning (an error here, see pyproject's filterwarnings) then fails an innocent test
# at random. CI failed tests/proxy/test_answer_model.py on a socket an earlier file left open.
# A full collection after each file pins a leak on the file that made it, every time.


@pytest.fixture(scope="module", autouse=True)
def _collect_what_the_file_left() -> Iterator[None]:
    yield
    gc.collect()


# --- end leaked resources ---------------------------------------------------------------------


# --- files left in the repository -------------------------------------------------------------
# A config with no `record.db` or `rollout.state` keeps them under ./.kvmigrate, and the tests
# run from the repository root: a test that starts a proxy or opens a store from such a config
# left .kvmigrate/records.db in the checkout (reading the gates' evidence once created an empty
# database, too). A module that makes the folder fails, and the folder is removed.

REPO_STATE = Path(__file__).resolve().parents[1] / ".kvmigrate"


@pytest.fixture(scope="module", autouse=True)
def _no_state_in_the_repository(request: pytest.FixtureRequest) -> Iterator[None]:
    before = REPO_STATE.exists()
    yield
    if not before and REPO_STATE.exists():
        left = sorted(p.name for p in REPO_STATE.iterdir())
        shutil.rmtree(REPO_STATE, ignore_errors=True)
        pytest.fail(
            f"{request.node.nodeid} left {REPO_STATE} ({', '.join(left)}): give its config a "
            "record.db and rollout.state under tmp_path"
        )


# --- end files left in the repository ---------------------------------------------------------
