"""`kvmigrate cachecheck` as a user runs it: JSONL in, a report out, documented exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cachecheck_support import CLEAN, PLANTED, SYSTEM, USER, agent
from click.testing import CliRunner

from kvmigrate.cachecheck import Conversation
from kvmigrate.cli import main


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvmigrate", "cachecheck", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def run_here(*args: str) -> subprocess.CompletedProcess[str]:
    """The same command in this process: the many bad-input cases skip the CLI's ~2 s start."""
    result = CliRunner().invoke(main, ["cachecheck", *args])
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def write(path: Path, lines: list[Any]) -> str:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return str(path)


def whole(conversation: Conversation) -> dict[str, Any]:
    turns = [{"request": t.request, "response": t.response} for t in conversation.turns]
    return {"conversation": conversation.id, "turns": turns}


def test_planted_busters_are_reported_with_fixes_and_exit_2(tmp_path: Path) -> None:
    lines = [whole(agent(name, spec)) for name, spec, *_ in PLANTED]
    lines += [whole(agent(name, spec)) for name, spec in CLEAN]
    proc = run("--dataset", write(tmp_path / "c.jsonl", lines), "--price-per-mtok", "2.5")
    assert proc.returncode == 2, proc.stderr
    out = proc.stdout
    assert "top cache busters by tokens lost" in out
    assert "fix: move `Current time:` from the system prompt to the latest user message" in out
    assert "history_truncated (deliberate)" in out
    assert "estimated waste" in out
    assert "tok/s" in out
    assert "$" in out
    print(out[-1500:])


def test_json_output_is_machine_readable(tmp_path: Path) -> None:
    lines = [whole(agent(name, spec)) for name, spec, *_ in PLANTED[:3]]
    proc = run_here(
        "--dataset", write(tmp_path / "c.jsonl", lines), "--json", "--prefill-rate", "1000"
    )
    assert proc.returncode == 2
    data = json.loads(proc.stdout)
    assert data["summary"]["waste"]["prefill_tokens_per_s"] == 1000
    assert {b["class"] for b in data["summary"]["busters"]} == {"timestamp"}
    turns = data["conversations"][0]["turns"]
    assert turns[1]["break"]["class"] == "timestamp"
    assert turns[1]["break"]["message"] == 0
    assert 0 < turns[1]["reuse_ratio"] < 1


def test_clean_conversations_exit_0(tmp_path: Path) -> None:
    lines = [whole(agent(name, spec)) for name, spec in CLEAN]
    proc = run("--dataset", write(tmp_path / "c.jsonl", lines))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no cache busters" in proc.stdout
    assert "overall prefix reuse 100.0%" in proc.stdout


def _timestamped_requests() -> list[dict[str, Any]]:
    """Request bodies only (no responses): the answers are read from the next turn."""
    history: list[dict[str, Any]] = []
    bodies = []
    for t in range(3):
        history.append({"role": "user", "content": USER[t]})
        system = {"role": "system", "content": f"Current time: 2025-01-06 10:{10 + t}\n{SYSTEM}"}
        bodies.append({"model": "gpt-4o-mini", "messages": [system, *history]})
        history.append({"role": "assistant", "content": f"Answer {t}."})
    return bodies


def test_export_requests_format_is_accepted(tmp_path: Path) -> None:
    lines: list[Any] = [
        {
            "custom_id": f"req-{t}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": body,
            "metadata": {"conversation": "h:abc", "turn": t + 1, "backend": "hosted"},
        }
        for t, body in enumerate(_timestamped_requests())
    ]
    lines.append(
        {"custom_id": "e", "url": "/v1/embeddings", "body": {"input": "x"}, "metadata": {}}
    )
    proc = run("--dataset", write(tmp_path / "export.jsonl", lines), "--json")
    assert proc.returncode == 2, proc.stderr
    data = json.loads(proc.stdout)
    assert data["skipped_lines"] == 1
    assert [
        t["break"]["class"] if t["break"] else None for t in data["conversations"][0]["turns"]
    ] == [None, "timestamp", "timestamp"]


def test_recorded_rows_and_bare_bodies_are_grouped_into_conversations(tmp_path: Path) -> None:
    bodies = _timestamped_requests()
    rows = [
        {
            "conversation": "s1",
            "turn": t + 1,
            "ts": 100.0 + t,
            "role": "serve",
            "request_json": json.dumps(b),
        }
        for t, b in enumerate(bodies)
    ][::-1]  # file order is not time order: ts decides
    rows.append(
        {"conversation": "s1", "ts": 1.0, "role": "shadow", "request_json": json.dumps(bodies[0])}
    )
    bare = [{**b, "user": "u-7"} for b in _timestamped_requests()]
    keyed = [{"session_id": "s2", "body": b} for b in _timestamped_requests()]
    proc = run_here("--dataset", write(tmp_path / "rows.jsonl", rows + bare + keyed), "--json")
    assert proc.returncode == 2, proc.stderr
    data = json.loads(proc.stdout)
    assert [c["id"] for c in data["conversations"]] == ["s1", "u-7", "s2"]
    assert all(len(c["turns"]) == 3 for c in data["conversations"])
    assert data["summary"]["waste"]["breaks"] == 6


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"turns": []}\n{not json\n', "c.jsonl:2: not valid JSON"),
        ("[1, 2]\n", "c.jsonl:1: expected a JSON object, got a list"),
        ('{"hello": "world"}\n', "c.jsonl:1: not a request"),
        ('{"turns": [{"prompt": "x"}]}\n', "c.jsonl:1: turns[0] has no `messages` list"),
        ("\n\n", "no chat requests found"),
        (b"\xff\xfe\x00".decode("latin-1"), "not UTF-8"),
    ],
)
def test_bad_input_exits_1_with_a_clear_message(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "c.jsonl"
    path.write_bytes(content.encode("latin-1"))
    proc = (run if "not valid JSON" in message else run_here)("--dataset", str(path))
    assert proc.returncode == 1
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["--dataset", "/nonexistent/c.jsonl"],
        [],
        ["--dataset", "x.jsonl", "--prefill-rate", "0"],
        ["--dataset", "x.jsonl", "--bogus"],
    ],
)
def test_bad_invocations_exit_1_without_traceback(args: list[str]) -> None:
    proc = (run if not args else run_here)(*args)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip()


def test_a_conversation_id_reaches_the_terminal_escaped(tmp_path: Path) -> None:
    """The dataset is anyone's: an escape sequence or a bidi control in an id is shown
    escaped, never acted on by the terminal."""
    name, spec, *_ = PLANTED[0]
    line = whole(agent(name, spec)) | {"conversation": "agent\x1b[2J\u202eeliforp"}
    proc = run_here("--dataset", write(tmp_path / "c.jsonl", [line]))
    assert proc.returncode == 2, proc.stderr
    assert "\x1b" not in proc.stdout
    assert "\u202e" not in proc.stdout
    assert "conversation agent\\x1b[2J\\u202eeliforp" in proc.stdout
