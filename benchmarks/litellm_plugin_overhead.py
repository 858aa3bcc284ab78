"""What the kvmigrate plugin adds to LiteLLM's proxy: p50 latency, side by side, one run.

LiteLLM proxy processes run at once against the same emulators (time_scale 0, so answers
are immediate and only proxy overhead is left):
  litellm          LiteLLM alone (no callbacks): the baseline
  plugin           LiteLLM with this tree's plugin, split mode at 0% (routing + recording)
  +shadow          this tree's plugin in shadow mode (also copies every request to the
                   candidate emulator and scores it)
  plugin@REF       the same two with the plugin of git ref REF (`--before`, default main),
  +shadow@REF      its `kvmigrate` package exported with `git archive`: before and after a
                   change, in one run
Requests alternate between the processes one by one, in a shuffled order, so drift (CPU
frequency, other load) hits all of them alike. Chat completions (`--stream`: streamed), one
at a time, keep-alive. Target: the plugin adds at most 1 ms p50 over LiteLLM alone.

    python benchmarks/litellm_plugin_overhead.py [--requests 1000] [--before main] [--stream]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

from kvmigrate.emulator.server import build_app
from kvmigrate.emulator.settings import EmulatorSettings
from kvmigrate.serving import BackgroundServer
from kvmigrate.testbed.litellm_process import (
    PLUGIN_CALLBACK,
    LiteLLMProxy,
    model_entry,
    write_config,
)

# The plugin's first import path, which every git ref has (this tree keeps it as an alias of
# PLUGIN_CALLBACK): the path a `--before` ref's plugin is loaded by.
FIRST_PLUGIN_CALLBACK = "kvmigrate.integrations.litellm_plugin.proxy_handler_instance"

MODEL = "gpt-4o-mini"
CANDIDATE = "vllm-llama"
VLLM_MODEL = "llama-3.1-8b"
KEY = "sk-bench"


def _kv_config(root: Path, name: str, mode: str, hosted: str, vllm: str) -> Path:
    path = root / f"{name}.kvmigrate.yaml"
    path.write_text(
        f"""
backends:
  hosted: {{api_base: "{hosted}/v1"}}
  vllm: {{api_base: "{vllm}/v1"}}
models:
  - {{model_name: {MODEL}, hosted: {MODEL}, vllm: {CANDIDATE}}}
rollout:
  mode: {mode}
  percent: 0
  noise_sample: 0
  state: sqlite:///{root}/{name}.state.db
record:
  db: sqlite:///{root}/{name}.records.db
  content: redacted
"""
    )
    return path


REPO = Path(__file__).resolve().parents[1]


def export_package(ref: str, into: Path) -> Path:
    """The `kvmigrate` package at git ref `ref`, written below `into` (for PYTHONPATH)."""
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", ref, "kvmigrate"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


# A proxy closes a keep-alive connection idle for seconds (uvicorn's default: 5 s), which a
# busy machine's interleaved loop can leave it: such a request is sent again, fresh.
_CLOSED = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


def _request(connection: http.client.HTTPConnection, body: bytes) -> float:
    try:
        return _timed(connection, body)
    except _CLOSED:
        connection.close()
        return _timed(connection, body)


def _timed(connection: http.client.HTTPConnection, body: bytes) -> float:
    started = time.perf_counter()
    connection.request(
        "POST",
        "/v1/chat/completions",
        body=body,
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
    )
    response = connection.getresponse()
    response.read()  # a stream too: to its last event
    elapsed = time.perf_counter() - started
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}")
    return elapsed


def hook_cost(root: Path, hosted: str, vllm: str, n: int = 20_000) -> dict[str, float]:
    """The plugin's own time per request, in-process: the pre-call hook (on the response
    path) and the success hook (after the answer), p50 in microseconds."""
    from datetime import datetime

    from kvmigrate.config import load_config

    # The plugin's first path: the tree measured may be a git ref from before it moved.
    from kvmigrate.integrations.litellm_plugin import KvmigrateRouter

    config = load_config(_kv_config(root, "inproc", "split", hosted, vllm))
    answer = {
        "id": "x",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi " * 40}}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 40},
    }

    async def run() -> dict[str, float]:
        plugin = KvmigrateRouter(config)
        pre: list[float] = []
        post: list[float] = []
        for i in range(n):
            headers = {"x-session-id": f"s-{i}", "content-type": "application/json"}
            body = {"model": MODEL, "messages": [{"role": "user", "content": f"q {i}"}]}
            data = {
                **body,
                "metadata": {"headers": headers},
                "litellm_call_id": f"c-{i}",
                "proxy_server_request": {"headers": headers, "body": dict(body)},
            }
            t0 = time.perf_counter()
            await plugin.async_pre_call_hook(None, None, data, "acompletion")
            t1 = time.perf_counter()
            now = datetime.now()
            kwargs = {"litellm_call_id": f"c-{i}", "api_call_start_time": now}
            await plugin.async_log_success_event(kwargs, answer, now, now)
            t2 = time.perf_counter()
            pre.append(t1 - t0)
            post.append(t2 - t1)
        await plugin.aclose()
        return {
            "pre_call_hook_p50_us": statistics.median(pre) * 1e6,
            "success_hook_p50_us": statistics.median(post) * 1e6,
        }

    return asyncio.run(run())


def hook_cost_of(tree: Path | None, root: Path, hosted: str, vllm: str) -> dict[str, float]:
    """`hook_cost` of the plugin in `tree` (None: this tree's), in a process of its own."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    work = tempfile.mkdtemp(prefix="hooks-", dir=root)
    command = [sys.executable, __file__, "--hooks-only", work, hosted, vllm]
    done = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    figures: dict[str, float] = json.loads(done.stdout)
    return figures


def hook_costs(tree: Path | None, root: Path, hosted: str, vllm: str) -> dict[str, object]:
    """This tree's and `tree`'s in-process hook costs, measured in turns (A B A B), each
    side's lower median kept: the in-process figure is the one a busy machine disturbs
    least."""
    sides: dict[str, list[dict[str, float]]] = {"this": [], "before": []}
    for _ in range(2):
        sides["this"].append(hook_cost_of(None, root, hosted, vllm))
        if tree is not None:
            sides["before"].append(hook_cost_of(tree, root, hosted, vllm))
    return {
        side: {key: min(run[key] for run in runs) for key in runs[0]}
        for side, runs in sides.items()
        if runs
    }


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--hooks-only":  # a child of `hook_cost_of`
        print(json.dumps(hook_cost(Path(sys.argv[2]), sys.argv[3], sys.argv[4], n=5_000)))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=1000, help="measured requests per proxy")
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument(
        "--before", default="main", help="git ref of the plugin to compare with ('': none)"
    )
    parser.add_argument("--stream", action="store_true", help="streamed chat completions")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()

    # The processes stop (ExitStack) before their folder goes.
    with tempfile.TemporaryDirectory(prefix="kvm-litellm-") as tmp, ExitStack() as stack:
        root = Path(tmp)
        hosted = stack.enter_context(
            BackgroundServer(lambda: build_app(EmulatorSettings(profile="hosted", time_scale=0)))
        )
        vllm = stack.enter_context(
            BackgroundServer(
                lambda: build_app(
                    EmulatorSettings(profile="vllm", time_scale=0, models=(VLLM_MODEL,))
                )
            )
        )
        models = [
            model_entry(MODEL, MODEL, hosted.url + "/v1"),
            model_entry(CANDIDATE, VLLM_MODEL, vllm.url + "/v1"),
        ]
        kinds: list[tuple[str, str | None, Path | None]] = [
            ("litellm", None, None),
            ("plugin", "split", None),
            ("+shadow", "shadow", None),
        ]
        if args.before:
            tree = export_package(args.before, root / "before")
            kinds += [
                (f"plugin@{args.before}", "split", tree),
                (f"+shadow@{args.before}", "shadow", tree),
            ]
        targets: dict[str, LiteLLMProxy] = {}
        for name, mode, tree in kinds:
            slug = name.strip("+").replace("@", "-").replace("/", "-")
            callbacks = (
                [PLUGIN_CALLBACK if tree is None else FIRST_PLUGIN_CALLBACK] if mode else None
            )
            config = write_config(root / f"{slug}.litellm.yaml", models, callbacks)
            kv = _kv_config(root, slug, mode, hosted.url, vllm.url) if mode else None
            env = {"PYTHONPATH": str(tree)} if tree is not None else None
            proxy = LiteLLMProxy(config, kv, master_key=KEY, extra_env=env)
            targets[name] = stack.enter_context(proxy)

        connections = {
            name: http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
            for name, proxy in targets.items()
        }
        times: dict[str, list[float]] = {name: [] for name in targets}
        for i in range(args.warmup + args.requests):
            body = json.dumps(
                {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": f"hello {uuid.uuid4().hex[:8]}"}],
                    "max_tokens": 16,
                    **({"stream": True} if args.stream else {}),
                }
            ).encode()
            order = list(connections.items())
            random.shuffle(order)  # no proxy always goes first
            for name, connection in order:
                elapsed = _request(connection, body)
                if i >= args.warmup:
                    times[name].append(elapsed)
        for connection in connections.values():
            connection.close()
        before_tree = root / "before" if args.before else None
        in_process = hook_costs(before_tree, root, hosted.url, vllm.url)

    p50 = {name: statistics.median(values) * 1000 for name, values in times.items()}
    p90 = {name: statistics.quantiles(values, n=10)[-1] * 1000 for name, values in times.items()}
    figures = {
        "requests": args.requests,
        "stream": args.stream,
        "before": args.before,
        "p50_ms": p50,
        "p90_ms": p90,
        "added_p50_ms": {name: p50[name] - p50["litellm"] for name in p50 if name != "litellm"},
        "target_added_p50_ms": 1.0,
        "in_process": in_process,
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    kind = "streamed" if args.stream else "non-streamed"
    print(f"{args.requests} {kind} chat requests per proxy, interleaved")
    for name in times:
        added = "" if name == "litellm" else f"  added p50 {p50[name] - p50['litellm']:+.3f} ms"
        print(f"  {name:<16} p50 {p50[name]:7.3f} ms  p90 {p90[name]:7.3f} ms{added}")
    if args.before:
        for mine, theirs in (
            ("plugin", f"plugin@{args.before}"),
            ("+shadow", f"+shadow@{args.before}"),
        ):
            change = (p50[mine] - p50["litellm"]) - (p50[theirs] - p50["litellm"])
            print(f"  {mine} vs {theirs}: added p50 {change:+.3f} ms")
    for side, cost in in_process.items():
        assert isinstance(cost, dict)
        label = "this tree" if side == "this" else args.before
        print(
            f"in-process ({label}), per request: pre-call hook (response path) "
            f"p50 {cost['pre_call_hook_p50_us']:.1f} us, "
            f"success hook (after the answer) p50 {cost['success_hook_p50_us']:.1f} us"
        )


if __name__ == "__main__":
    main()
