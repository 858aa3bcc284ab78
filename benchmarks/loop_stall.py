"""How long a long streamed tool call and gzip bombs hold the proxy's event loops: /health
latency while they run, through `kvmigrate proxy --workers 2`.

    .venv/bin/python benchmarks/loop_stall.py [--deltas 100000] [--bombs 4] [--probe-ms 10]

Two emulators (`kvmigrate emulate`, time scale 0) and the proxy pool (shadow mode at
sample 0, recorder on, a master key) run as processes of their own. This process probes
/health on a fresh connection every `--probe-ms` (the kernel spreads fresh connections
over the workers, so the probes reach the busy one too) while, in turn:

    idle      nothing else
    stream    one client streams a tool call of `--deltas` argument deltas (the
              emulator's tool schema asks for a string that long), and the probes go on
              for 3 s after its last byte, while the proxy deals with the whole answer
    bombs     `--bombs` gzip bodies of 1 MB that inflate to 1 GiB each, half without the
              key (a 401) and half with it (a 413)
    both      the stream and the bombs at once

and prints each phase's /health p50, p99 and max (ms), and how many probes failed. Then,
in this process, the reassembly of streamed answers of 10,000 and 100,000 deltas (chat
tool-call arguments, Responses function-call arguments, Anthropic text deltas): a time
ratio near 10 is linear; concatenating each delta onto the last made it near 100.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import socket
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path

from soak import ChildProcess, emulator_process

from kvmigrate.percentile import percentile
from kvmigrate.serving import free_port
from kvmigrate.wire.assemble import assemble

MODEL = "gpt-4o-mini"
KEY = "sk-loop-stall"
PROBE_TAIL_S = 3.0


def pool_config(tmp: Path, port: int, hosted: str, vllm: str) -> Path:
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


def tool_request(deltas: int) -> bytes:
    """A chat request whose answer is one tool call of about `deltas` argument deltas: the
    emulator fills the schema's string to its minLength, in pieces of 4 characters at most."""
    schema = {"type": "string", "minLength": deltas * 4 + 2_000}
    tool = {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write a file",
            "parameters": {
                "type": "object",
                "properties": {"content": schema},
                "required": ["content"],
            },
        },
    }
    ask = [{"role": "user", "content": "Write the file report.txt about quarterly revenue"}]
    body = {"model": MODEL, "messages": ask, "tools": [tool], "stream": True}
    return json.dumps(body).encode()


def stream_tool_call(port: int, deltas: int) -> tuple[int, float]:
    """(argument deltas received, seconds): the stream read as fast as it comes."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    started = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", tool_request(deltas), headers)
    response = conn.getresponse()
    assert response.status == 200, response.read()[:300]
    parts = []
    while data := response.read1(1 << 16):
        parts.append(data)
    seconds = time.perf_counter() - started
    conn.close()
    body = b"".join(parts)
    assert body.endswith(b"data: [DONE]\n\n"), body[-200:]
    return body.count(b'"arguments":') - 1, seconds  # less the call's opening delta


def bomb() -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    parts = [packer.compress(b'{"model": "gpt-4o-mini", "pad": "')]
    parts += [packer.compress(zeros) for _ in range(1024)]
    return b"".join([*parts, packer.flush()])


def send_bomb(port: int, body: bytes, keyed: bool) -> int:
    head = [
        b"POST /v1/chat/completions HTTP/1.1",
        b"Host: proxy",
        b"Connection: close",
        b"Content-Type: application/json",
        b"Content-Encoding: gzip",
        b"Content-Length: %d" % len(body),
    ]
    if keyed:
        head.append(b"Authorization: Bearer " + KEY.encode())
    with socket.create_connection(("127.0.0.1", port), timeout=600) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(b"\r\n".join(head) + b"\r\n\r\n" + body)
        data = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                data += chunk
    return int(data.split(b" ", 2)[1])


class Prober:
    """/health on a fresh connection every `interval` seconds, on a thread of its own."""

    def __init__(self, port: int, interval: float) -> None:
        self.port, self.interval = port, interval
        self.latencies: list[float] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
                conn.request("GET", "/health", headers={"Connection": "close"})
                ok = conn.getresponse().status == 200
                conn.close()
            except OSError:
                ok = False
            elapsed = time.perf_counter() - started
            if ok:
                self.latencies.append(elapsed)
            else:
                self.failures += 1
            self._stop.wait(max(0.0, self.interval - elapsed))

    def row(self, name: str) -> str:
        ms = sorted(x * 1000 for x in self.latencies)
        if not ms:
            return f"{name:<7} no probe answered ({self.failures} failed)"
        return (
            f"{name:<7} probes {len(ms):>5}  p50 {percentile(ms, 50):7.1f}  "
            f"p99 {percentile(ms, 99):7.1f}  max {ms[-1]:7.1f} ms  failed {self.failures}"
        )


def phase(name: str, port: int, interval: float, work: Callable[[], str]) -> None:
    with Prober(port, interval) as prober:
        time.sleep(0.3)
        note = work()
        time.sleep(PROBE_TAIL_S)
    print(prober.row(name), note, flush=True)


def run_pool(deltas: int, bombs: int, interval: float, tmp: Path) -> None:
    body = bomb()
    ports = [free_port() for _ in range(3)]
    with contextlib.ExitStack() as stack:
        hosted, vllm = (
            stack.enter_context(emulator_process(p, port, 0.0, tmp / f"{p}.log").start())
            for p, port in (("hosted", ports[0]), ("vllm", ports[1]))
        )
        config = pool_config(tmp, ports[2], hosted.url, vllm.url)
        args = ["proxy", "--config", str(config), "--workers", "2"]
        stack.enter_context(ChildProcess(args, ports[2], tmp / "proxy.log").start())
        port = ports[2]
        stream_tool_call(port, 100)  # warm up both sides
        print(f"--workers 2, {deltas} deltas, {bombs} bombs of {len(body):,} bytes -> 1 GiB")

        def streamed() -> str:
            count, seconds = stream_tool_call(port, deltas)
            return f"({count} deltas in {seconds:.1f} s)"

        def bombed() -> str:
            statuses: list[int] = []
            threads = [
                threading.Thread(target=lambda k=i % 2: statuses.append(send_bomb(port, body, k)))
                for i in range(bombs)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            return f"(statuses {sorted(statuses)})"

        def both() -> str:
            bombing = threading.Thread(target=bombed)
            bombing.start()
            note = streamed()
            bombing.join()
            return note

        phase("idle", port, interval, lambda: (time.sleep(2.0), "")[1])
        phase("stream", port, interval, streamed)
        phase("bombs", port, interval, bombed)
        phase("both", port, interval, both)


def chat_body(n: int) -> bytes:
    def event(delta: dict[str, object]) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": None}
        return b"data: " + json.dumps({"id": "c", "choices": [choice]}).encode() + b"\n\n"

    piece = event({"tool_calls": [{"index": 0, "function": {"arguments": "ab c"}}]})
    head = event({"tool_calls": [{"index": 0, "id": "x", "function": {"name": "w"}}]})
    return head + piece * n + b"data: [DONE]\n\n"


def responses_body(n: int) -> bytes:
    created = {"type": "response.created", "response": {"id": "r", "output": []}}
    item = {"type": "function_call", "name": "w", "arguments": ""}
    added = {"type": "response.output_item.added", "output_index": 0, "item": item}
    delta = {"type": "response.function_call_arguments.delta", "output_index": 0, "delta": "ab c"}
    events = [created, added] + [delta] * n  # cut short: no response.completed
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)


def messages_body(n: int) -> bytes:
    start = {"type": "message_start", "message": {"id": "m", "content": [], "usage": {}}}
    block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}}
    text = {"type": "text_delta", "text": "ab c"}
    delta = {"type": "content_block_delta", "index": 0, "delta": text}
    events = [start, block] + [delta] * n
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)


def assembly_ratios() -> None:
    print("reassembly in this process (best of 3):")
    for route, make in (
        ("chat/completions", chat_body),
        ("responses", responses_body),
        ("messages", messages_body),
    ):
        times = []
        for n in (10_000, 100_000):
            body = make(n)
            best = min(_timed(lambda b=body, r=route: assemble(r, b)) for _ in range(3))
            times.append(best)
        print(
            f"  {route:<17} 10k {times[0] * 1000:7.1f} ms  100k {times[1] * 1000:8.1f} ms  "
            f"ratio {times[1] / times[0]:5.1f}"
        )


def _timed(work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--deltas", type=int, default=100_000)
    parser.add_argument("--bombs", type=int, default=4)
    parser.add_argument("--probe-ms", type=float, default=10.0)
    parser.add_argument("--workdir", type=Path, help="keep config and logs here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kvmigrate-loop-stall-") as tmp:
        run_pool(args.deltas, args.bombs, args.probe_ms / 1000, args.workdir or Path(tmp))
    assembly_ratios()
    return 0


if __name__ == "__main__":
    sys.exit(main())
