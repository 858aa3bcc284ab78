"""The spool's files: frames read back in order from the last ack, finished segments
removed once acked, and a frame cut short by a crash skipped, never misread."""

from __future__ import annotations

import os
from pathlib import Path

from kvmigrate.recorder.spool import EXCHANGES, HEADER, SpoolReader, SpoolWriter, segments


def _payloads(n: int) -> list[bytes]:
    return [f"frame {i} ".encode() * 50 for i in range(n)]


def test_frames_come_back_in_order_and_a_new_reader_starts_at_the_ack(tmp_path: Path) -> None:
    writer = SpoolWriter(tmp_path, segment_bytes=2000)
    for payload in _payloads(10):
        writer.append(EXCHANGES, payload, 1)
    assert len(segments(tmp_path)) > 1  # rotated
    reader = SpoolReader(tmp_path)
    first = reader.read(1)
    assert [f.payload for f in first] == _payloads(1)
    reader.commit(first[-1].end)
    reader.close()

    again = SpoolReader(tmp_path)  # a worker started after the last one died
    frames = again.read(1 << 20)
    assert [f.payload for f in frames] == _payloads(10)[1:]
    assert frames[-1].end == writer.end


def test_acked_segments_are_removed_and_the_backlog_ages_from_the_oldest_unacked(
    tmp_path: Path,
) -> None:
    writer = SpoolWriter(tmp_path, segment_bytes=2000)
    for payload in _payloads(10):
        writer.append(EXCHANGES, payload, 1)
    reader = SpoolReader(tmp_path)
    frames = reader.read(1 << 20)
    first_written = frames[0].written_at
    assert reader.backlog_age(first_written + 5.0) == 5.0
    reader.commit(frames[-1].end)
    assert len(segments(tmp_path)) == 1  # only the one the ack lies in is kept
    assert reader.backlog_age(first_written + 5.0) == 0.0
    reader.close()


def test_a_frame_cut_short_waits_while_written_and_is_skipped_once_final(tmp_path: Path) -> None:
    writer = SpoolWriter(tmp_path)
    payloads = _payloads(3)
    for payload in payloads:
        writer.append(EXCHANGES, payload, 1)
    writer.close()
    [segment] = tmp_path.glob("*.seg")
    os.truncate(segment, segment.stat().st_size - 10)  # the last write, cut by a kill -9
    reader = SpoolReader(tmp_path)
    assert [f.payload for f in reader.read(1 << 20)] == payloads[:2]
    assert reader.read(1 << 20) == []  # its writer may still be writing it
    assert reader.torn == 0
    assert reader.read(1 << 20, final=True) == []  # its writer is gone
    assert reader.torn == 1
    assert reader.position == segment.stat().st_size
    reader.close()


def test_a_synced_spool_checks_each_frame_against_its_crc(tmp_path: Path) -> None:
    """After a machine's crash a file may hold a block that was never written."""
    writer = SpoolWriter(tmp_path, sync=True)
    for payload in _payloads(2):
        writer.append(EXCHANGES, payload, 1)
    writer.close()
    [segment] = tmp_path.glob("*.seg")
    data = bytearray(segment.read_bytes())
    data[HEADER.size + 5] ^= 0xFF  # the first frame's payload, garbled
    segment.write_bytes(bytes(data))
    reader = SpoolReader(tmp_path)
    assert reader.read(1 << 20, final=True) == []
    assert reader.torn == 1
    reader.close()
