"""The table beside the pool's link table where a worker writes how each shadow copy of a
chained turn ended (the candidate's own id, or none), for another worker's copy of the next
turn to continue the candidate's chain."""

from __future__ import annotations

import time
from pathlib import Path

from kvmigrate.rollout.link_table import LinkTable, create_table
from kvmigrate.rollout.mirror_table import FILE_NAME


def test_what_one_worker_writes_another_reads_by_candidate(tmp_path: Path) -> None:
    path = create_table(str(tmp_path))
    writer, reader = LinkTable(path).mirrors, LinkTable(path).mirrors
    assert writer is not None
    assert reader is not None
    expires = time.time() + 60
    assert reader.read("resp_1", "") is None  # still running, as far as anyone knows
    writer.ended("resp_1", "", "resp_own_1", expires)
    writer.ended("resp_2", "", None, expires)  # that copy failed, or was never sent
    writer.ended("resp_1", "vllm-b", "resp_b_1", expires)
    assert reader.read("resp_1", "") == "resp_own_1"
    assert reader.read("resp_2", "") == ""
    assert reader.read("resp_1", "vllm-b") == "resp_b_1"
    assert reader.read("resp_2", "vllm-b") is None


def test_an_id_too_long_for_a_slot_is_left_to_the_store(tmp_path: Path) -> None:
    mirrors = LinkTable(create_table(str(tmp_path))).mirrors
    assert mirrors is not None
    mirrors.ended("resp_1", "", "resp_" + "x" * 300, time.time() + 60)
    assert mirrors.read("resp_1", "") is None
    mirrors.ended("resp_1", "", "resp_" + "x" * 250, time.time() + 60)  # 255 bytes: fits
    assert mirrors.read("resp_1", "") == "resp_" + "x" * 250


def test_a_link_table_without_its_mirror_table_still_shares_links(tmp_path: Path) -> None:
    path = create_table(str(tmp_path))
    (tmp_path / FILE_NAME).unlink()
    table = LinkTable(path)
    assert table.mirrors is None
    assert table.put("c:1", "h:0123456789abcdef01234567", 2, time.time() + 60)
