"""Shared pytest fixtures. Each section belongs to one part of the test bed; keep them apart."""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from stores import RedisServer

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
# database, too). A module that makes the folder fails, and the folder is removed. Under xdist
# the files of other workers run meanwhile: the folder is left in place (one of them may be
# writing to it), and the failure says the file may be another's (`-p no:xdist` on the files
# named finds the one).

REPO_STATE = Path(__file__).resolve().parents[1] / ".kvmigrate"


@pytest.fixture(scope="module", autouse=True)
def _no_state_in_the_repository(request: pytest.FixtureRequest) -> Iterator[None]:
    before = REPO_STATE.exists()
    yield
    if not before and REPO_STATE.exists():
        left = sorted(p.name for p in REPO_STATE.iterdir())
        beside = os.environ.get("PYTEST_XDIST_WORKER")
        if beside is None:
            shutil.rmtree(REPO_STATE, ignore_errors=True)
        pytest.fail(
            f"{request.node.nodeid}{' (or a file on another xdist worker)' if beside else ''} "
            f"left {REPO_STATE} ({', '.join(left)}): give its config a record.db and "
            "rollout.state under tmp_path"
        )


# --- end files left in the repository ---------------------------------------------------------


# --- markers and xdist workers ----------------------------------------------------------------
# A test is marked for what it needs from the fixtures it uses, so a new test is marked without
# anyone remembering to: `-m "not redis and not postgres"` is a loop without those servers.
#
# Under `--dist loadgroup` (scripts/test.sh runs the suite on several xdist workers) the
# scheduler below sends each file whole to one worker, so its module-scoped fixtures
# (emulators, proxies, LiteLLM stacks) start once, and a full collection runs once per file
# (`_collect_what_the_file_left`), not once per test. The files of the session's vLLM (those
# under tests/vllm/ and those named *_real_vllm.py) go to one worker together, so it starts
# once and no two engines compete for the cores; a test elsewhere that asks for `real_vllm`
# is refused at collection. Each worker has its own Redis and PostgreSQL (they start in
# milliseconds and a few seconds). The vLLM files, then the files holding `slow` or `litellm`
# tests, are queued first (--no-loadscope-reorder keeps this order), so none of them starts
# last and holds up the end of the run.
#
# Files, not xdist_group marks: xdist 3.8 groups by a suffix it writes into the node id,
# which pytest 9.2 no longer reads (pytest-xdist#1386), so the marks are silently ignored.
#
# Each worker also runs in a session of its own. Linux shares the CPU between sessions
# (autogroup), and the recorder's and detector's workers run at SCHED_IDLE: in one session
# with the other xdist workers, they got no CPU while those were busy, and tests waiting for
# records failed (docs/time-in-tests.md). In its own session, a worker's SCHED_IDLE children
# run while that worker's test waits for them, as in a run without xdist.

NEEDS: dict[str, frozenset[str]] = {
    "vllm": frozenset({"real_vllm"}),
    "redis": frozenset({"redis_server", "redis_url", "fresh_redis_url", "paused"}),
    "postgres": frozenset({"postgres", "pg_url"}),
}
QUEUED_FIRST = ("slow", "litellm", "playbook")
VLLM_GROUP = "vllm"


def worker_group(nodeid: str) -> str:
    """The scheduling unit of a test: its file, or the vLLM files' one group."""
    path = nodeid.split("::", 1)[0]
    shares_vllm = path.startswith("tests/vllm/") or path.endswith("_real_vllm.py")
    return VLLM_GROUP if shares_vllm else path


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker
        with contextlib.suppress(PermissionError):  # already a group leader: keep its own
            os.setsid()


@pytest.hookimpl(optionalhook=True)  # an xdist hook: unknown without xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid)

    return FileScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for marker, fixtures in NEEDS.items():
            if fixtures.intersection(item.fixturenames) and not item.get_closest_marker(marker):
                item.add_marker(marker)
        if "real_vllm" in item.fixturenames and worker_group(item.nodeid) != VLLM_GROUP:
            raise pytest.UsageError(
                f"{item.nodeid} uses real_vllm: put it under tests/vllm/ or in a file named "
                "*_real_vllm.py, whose tests share the session's vLLM on one xdist worker"
            )
    # Only the workers collect: xdist sets `loadgroup` there, from the `--dist` they run under.
    if getattr(config.option, "loadgroup", False):
        first = {
            worker_group(item.nodeid)
            for item in items
            if any(item.get_closest_marker(name) for name in QUEUED_FIRST)
        }
        # The vLLM group first: its engine's start is the longest wait in the suite.
        items.sort(
            key=lambda item: (
                worker_group(item.nodeid) != VLLM_GROUP,
                worker_group(item.nodeid) not in first,
            )
        )


# --- end markers and xdist workers ------------------------------------------------------------


# --- real stores ------------------------------------------------------------------------------
# SQLite files in tmp dirs, and one real redis-server per session (per xdist worker), for the
# tests of the rollout store and of the conversation links and chains kept in it
# (tests/rollout/, tests/continuity/; the server itself is tests/stores.py). A test that
# reaches Redis is marked `redis` from these fixtures (above).


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    from stores import running_redis

    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture
def paused(redis_server: RedisServer) -> Iterator[RedisServer]:
    """The session's Redis for a test that pauses it (SIGSTOP, a hung store): resumed
    after the test whatever happens."""
    try:
        yield redis_server
    finally:
        redis_server.process.send_signal(signal.SIGCONT)


@pytest.fixture
def fresh_redis_url(redis_url: str, request: pytest.FixtureRequest) -> str:
    """The session's Redis, emptied for this test."""
    import redis

    # `-m "not redis"` must leave out every test that starts one: one that reaches Redis
    # through `getfixturevalue` is not marked from its fixtures, so it says so itself.
    assert request.node.get_closest_marker("redis"), f"mark {request.node.nodeid} `redis`"

    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    client.close()
    return redis_url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/state.db"


# --- end real stores --------------------------------------------------------------------------
