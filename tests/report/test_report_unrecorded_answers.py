"""`kvmigrate report` says how many answers in its window have no record: the proxy counts
what it answered (per minute, into the records database), so a recorder that drops records
shows in the report, instead of the report silently describing fewer answers."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
from click.testing import CliRunner

from kvmigrate.cli import main
from kvmigrate.proxy.exchange import Exchange
from kvmigrate.recorder import RecorderAddon, WriterSettings

ANSWERS = 50
CONFIG = """
backends:
  hosted: {{api_base: "http://127.0.0.1:9/v1"}}
  vllm: {{api_base: "http://127.0.0.1:9/v1"}}
models:
  - {{model_name: m, hosted: m, vllm: m}}
record: {{db: "{db}", content: redacted}}
"""


def _exchange(i: int) -> Exchange:
    now = time.perf_counter()
    x = Exchange(
        request_id=f"req_{i}", route="chat/completions", backend="hosted", role="serve",
        model="m", served_model="m", conversation=f"c{i}", turn=1, stream=False,
        started=now - 0.1, request_body=b'{"model": "m", "messages": []}', status=200,
        first_byte=now, finished=now,
    )  # fmt: skip
    x.chunks = [b'{"choices": [{"message": {"role": "assistant", "content": "ok"}}]}']
    return x


def test_the_report_counts_the_answers_that_have_no_record(tmp_path: Path) -> None:
    """A recorder whose queue overflows drops answers, and counts them: the report names the
    same number as answers without a record."""
    db = f"sqlite:///{tmp_path}/records.db"
    recorder = RecorderAddon(db, settings=WriterSettings(queue_size=5))
    recorder.start()
    for i in range(ANSWERS):  # faster than the feeder takes them: most overflow
        recorder.exchange_done(_exchange(i))
    recorder.close(timeout=120)
    dropped = recorder.stats.dropped["queue_full"]
    assert 0 < dropped < ANSWERS
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG.format(db=db))

    text = CliRunner().invoke(main, ["report", "--config", str(config), "--since", "1h"])
    assert text.exit_code == 0, text.output
    assert f"Answers recorded: {ANSWERS - dropped:,} of the {ANSWERS:,}" in text.output
    assert f"{dropped:,} answers without a record" in text.output

    args = ["report", "--config", str(config), "--since", "1h", "--format", "json"]
    data = orjson.loads(CliRunner().invoke(main, args).output)
    assert data["completeness"]["answered"] == ANSWERS
    assert data["completeness"]["missing"] == dropped
