"""The table beside the pool's link table where a worker says how each shadow copy of a
chained turn runs and ends (the candidate's own id, or none), for another worker's copy of
the next turn to continue the candidate's chain."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from kvmigrate.continuity.chains import SHADOW_ID_WAIT, ChainMap
from kvmigrate.continuity.link_table import LinkTable, create_table
from kvmigrate.continuity.resolver import ContinuityResolver
from kvmigrate.continuity.shadow_id_table import ENDED, FILE_NAME, IN_STORE, RUNNING
from kvmigrate.policies.chain import RESPONSE_PREFIX, ChainEntry
from kvmigrate.rollout.state import RolloutState
from kvmigrate.rollout.store import open_store

CONVERSATION = "h:0123456789abcdef01234567"


def test_what_one_worker_says_another_reads_by_candidate(tmp_path: Path) -> None:
    path = create_table(str(tmp_path))
    writer, reader = LinkTable(path).shadow_ids, LinkTable(path).shadow_ids
    assert writer is not None
    assert reader is not None
    expires = time.time() + 60
    assert reader.read("resp_1", "") is None  # nobody said anything yet
    writer.running("resp_1", "", expires)
    assert reader.read("resp_1", "") == (RUNNING, "")
    writer.ended("resp_1", "", "resp_own_1", expires)
    writer.ended("resp_2", "", None, expires)  # that copy failed, or was never sent
    writer.ended("resp_1", "vllm-b", "resp_b_1", expires)
    assert reader.read("resp_1", "") == (ENDED, "resp_own_1")
    assert reader.read("resp_2", "") == (ENDED, "")
    assert reader.read("resp_1", "vllm-b") == (ENDED, "resp_b_1")
    assert reader.read("resp_2", "vllm-b") is None


def test_an_id_too_long_for_a_slot_is_said_to_be_in_the_store(tmp_path: Path) -> None:
    shadows = LinkTable(create_table(str(tmp_path))).shadow_ids
    assert shadows is not None
    shadows.ended("resp_1", "", "resp_" + "x" * 300, time.time() + 60)
    assert shadows.read("resp_1", "") == (IN_STORE, "")
    shadows.ended("resp_1", "", "resp_" + "x" * 250, time.time() + 60)  # 255 bytes: fits
    assert shadows.read("resp_1", "") == (ENDED, "resp_" + "x" * 250)


def test_a_link_table_without_its_shadow_table_still_shares_links(tmp_path: Path) -> None:
    path = create_table(str(tmp_path))
    (tmp_path / FILE_NAME).unlink()
    table = LinkTable(path)
    assert table.shadow_ids is None
    assert table.put("c:1", CONVERSATION, 2, time.time() + 60)


def test_another_workers_copy_is_waited_for_while_it_runs_and_a_failed_one_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two chain maps as two workers of one pool (one SQLite store, one table): a copy the
    first worker still runs is waited for past SHADOW_ID_WAIT, as a copy of its own would be;
    one that failed there is known to have no id at once."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))  # as in a pool's worker
    path = create_table(str(tmp_path))
    url = f"sqlite:///{tmp_path}/state.db"

    def worker() -> ChainMap:
        store = open_store(url, RolloutState())
        return ChainMap(ContinuityResolver(store, 60.0, table=LinkTable(path)))

    async def served(a: ChainMap, b: ChainMap, primary_id: str) -> None:
        """`a` answered `primary_id` and sends its copy; `b` can find the turn."""
        a.keep(RESPONSE_PREFIX + primary_id, ChainEntry(CONVERSATION, 1, "hosted"))
        a.expect_shadow_id(primary_id)
        async with asyncio.timeout(10):
            while await b.find(RESPONSE_PREFIX + primary_id) is None:  # noqa: ASYNC110
                await asyncio.sleep(0.02)  # the store has no event to wait on

    async def run() -> None:
        a, b = worker(), worker()
        await a.links.running()
        await served(a, b, "resp_1")
        waiting = asyncio.create_task(b.shadow_id_of("resp_1"))
        await asyncio.sleep(SHADOW_ID_WAIT + 0.5)
        assert not waiting.done()  # still running on the other worker: still waited for
        a.record_shadow_id("resp_1", "resp_own_1")
        assert await asyncio.wait_for(waiting, 5) == "resp_own_1"

        await served(a, b, "resp_2")
        a.record_shadow_id("resp_2", None)  # dropped, or failed
        started = time.monotonic()
        assert await b.shadow_id_of("resp_2") is None
        assert time.monotonic() - started < SHADOW_ID_WAIT / 2
        for chains in (a, b):
            await chains.links.done()
            assert chains.links.store is not None
            chains.links.store.close()

    asyncio.run(run())
