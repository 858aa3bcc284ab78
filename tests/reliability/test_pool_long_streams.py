"""`kvmigrate proxy --workers 2` through what a security probe found holding its event loops:
one client streams a tool call of 100,000 argument deltas while others send gzip bombs (1 MB
that inflates to 1 GiB, with and without the key). Every /health probe meanwhile is
answered; the stream arrives whole; the bombs get their 401 and 413. How long the probes
took is benchmarks/loop_stall.py's to print."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
import zlib
from pathlib import Path

import openai
import pytest
from reliability_support import ChildProcess, soak

from kvmigrate.serving import free_port

pytestmark = pytest.mark.timeout(600)
MODEL = "gpt-4o-mini"
KEY = "sk-pool-key"
DELTAS = 100_000
LENGTH = DELTAS * 4 + 2_000
# The emulator fills a string to its schema's minLength in pieces of 4 characters at most.
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write a file",
            "parameters": {
                "type": "object",
                "properties": {"content": {"type": "string", "minLength": LENGTH}},
                "required": ["content"],
            },
        },
    }
]


def config(tmp: Path, port: int, hosted: str, vllm: str) -> Path:
    """reliability_support.proxy_config's pool, with a master key: a bomb without it must
    get its 401 without anything inflated."""
    path = tmp / "config.yaml"
    path.write_text(f"""
server: {{host: 127.0.0.1, port: {port}, master_key: {KEY}}}
backends:
  hosted: {{api_base: "{hosted}/v1", read_timeout: 300}}
  vllm: {{api_base: "{vllm}/v1", read_timeout: 300}}
models:
  - {{model_name: {MODEL}, hosted: {MODEL}, vllm: meta-llama/Llama-3.1-8B-Instruct}}
rollout: {{mode: shadow, shadow_sample: 0, state: "sqlite:///{tmp}/state.db"}}
record: {{db: "sqlite:///{tmp}/records.db"}}
""")
    return path


def bomb() -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    parts = [packer.compress(b'{"model": "gpt-4o-mini", "pad": "')]
    parts += [packer.compress(zeros) for _ in range(1024)]
    return b"".join([*parts, packer.flush()])


def send_bomb(url: str, body: bytes, keyed: bool) -> tuple[int, str]:
    """(status, the error's code)."""
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    if keyed:
        headers["Authorization"] = f"Bearer {KEY}"
    request = urllib.request.Request(url + "/v1/chat/completions", body, headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return int(response.status), ""
    except urllib.error.HTTPError as refused:
        with refused:
            return refused.code, json.loads(refused.read())["error"]["code"]


class Probes:
    """/health on a fresh connection (the kernel picks the worker) every 20 ms."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.statuses: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Probes:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            request = urllib.request.Request(self.url + "/health", headers={"Connection": "close"})
            try:
                # Generous: a loaded test machine is slow, and this is no timing.
                with urllib.request.urlopen(request, timeout=60) as response:
                    self.statuses.append(int(response.status))
            except OSError:
                self.statuses.append(0)
            self._stop.wait(0.02)


@pytest.mark.slow
def test_health_is_answered_through_a_100000_delta_tool_call_and_gzip_bombs(
    tmp_path: Path,
) -> None:
    ports = [free_port() for _ in range(3)]
    hosted = soak.emulator_process("hosted", ports[0], 0.0, tmp_path / "hosted.log")
    vllm = soak.emulator_process("vllm", ports[1], 0.0, tmp_path / "vllm.log")
    with hosted.start(), vllm.start():
        path = config(tmp_path, ports[2], hosted.url, vllm.url)
        args = ["proxy", "--config", str(path), "--workers", "2"]
        proxy = ChildProcess(args, ports[2], tmp_path / "proxy.log")
        with proxy.start():
            body = bomb()
            bombs: list[tuple[int, str]] = []
            senders = [
                threading.Thread(target=lambda k=k: bombs.append(send_bomb(proxy.url, body, k)))
                for k in (False, True, False, True)
            ]
            client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=KEY, timeout=300)
            with Probes(proxy.url) as probes:
                stream = client.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": "Write the file report.txt"}],
                    tools=TOOLS,
                    stream=True,
                )
                deltas: list[str] = []
                for chunk in stream:
                    if len(deltas) == 1000:  # the stream under way: the bombs go off
                        for sender in senders:
                            sender.start()
                    for call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                        if call.function is not None and call.function.arguments:
                            deltas.append(call.function.arguments)
                for sender in senders:
                    sender.join()
                time.sleep(2)  # the proxy deals with the whole answer after its last byte
        log = proxy.output()  # stopped: its shutdown's lines too
    assert len(deltas) >= DELTAS
    assert len(json.loads("".join(deltas))["content"]) >= LENGTH
    assert sorted(bombs) == [(401, "invalid_api_key")] * 2 + [(413, "request_too_large")] * 2
    assert len(probes.statuses) > 20
    assert probes.statuses == [200] * len(probes.statuses)
    assert "Traceback" not in log, log[-3000:]
