"""CPU per request of two versions of the proxy side by side: did a change make it cheaper?

On this VM the CPU a request costs moves by half within minutes, so two versions measured
minutes apart compare the hours, not the code. Here both versions run at once, each a
`kvmigrate proxy --workers 1` in the default deployment (shadow to the candidate, recorder
and cache-buster on) pinned to core 0, as proxy_overhead.py pins its proxy, behind the C
stub (primary and candidate) on core 1. `wrk` (64 connections, one thread, on core 1)
alternates between them in short windows, the order flipping every pair; a window's sample
is the serving process's CPU over it (from /proc, its threads included) over the requests
served. That process is what bounds throughput at full load: the recorder's and the
detector's workers run at the lowest priority and catch up when it idles (at full load,
rarely), so their CPU is not in the window's sample; it lands in the other side's windows,
on the shared core. The figure is the median of B/A over the pairs; the workers' CPU is
given apart, over the whole run. Run it A/A (the same tree twice) to see the method's own
spread: about ±4% at 20 pairs of 2 s.

    python benchmarks/cpu_ab.py --a /path/to/old/checkout --b . [--pairs 20] [--window 2]

Each tree is put first on the proxy's PYTHONPATH, so it must hold `kvmigrate/` (a git
worktree of another commit does); the rest comes from this interpreter's environment.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import psutil
from proxy_overhead import (
    BODY,
    WRK_SCRIPT,
    cheapest_stub_argv,
    cpu_seconds,
    free_port,
    kvmigrate_config,
    pinned,
    process,
)


def main() -> None:
    args = parse_args()
    wrk = shutil.which("wrk")
    if wrk is None:
        raise SystemExit("cpu_ab.py needs wrk (apt-get install wrk)")
    args.a, args.b = args.a.resolve(), args.b.resolve()
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kvm-cpu-ab-")))
        # `python -m` puts the working directory first on sys.path, before PYTHONPATH: run
        # from a checkout, both proxies would import that checkout's kvmigrate.
        os.chdir(tmp)
        script = tmp / "post.lua"
        script.write_text(WRK_SCRIPT.format(body=json.dumps(BODY)))
        sides = {
            name: stack.enter_context(_side(tmp, name, tree))
            for name, tree in (("a", args.a), ("b", args.b))
        }
        for base, _pid in sides.values():  # warm: connections, caches, the collector
            _serve(wrk, script, base, 2.0)
        workers_before = {name: _workers_cpu(pid) for name, (_base, pid) in sides.items()}
        served = dict.fromkeys(sides, 0)
        pairs = []
        for n in range(args.pairs):
            order = ("a", "b") if n % 2 == 0 else ("b", "a")
            cost = {}
            for name in order:
                cost[name], count = _window_cost(wrk, script, *sides[name], args.window)
                served[name] += count
            pairs.append(cost)
            print(f"pair {n + 1:2d}: A {cost['a']:6.1f} us  B {cost['b']:6.1f} us", flush=True)
        time.sleep(args.window * 2)  # the workers catch up with what they were handed
        workers = {
            name: (_workers_cpu(pid) - workers_before[name]) / served[name] * 1e6
            for name, (_base, pid) in sides.items()
        }
    ratios = [pair["b"] / pair["a"] for pair in pairs]
    print(
        f"B/A CPU per request: median {statistics.median(ratios):.3f}, "
        f"mean {statistics.fmean(ratios):.3f} over {len(ratios)} pairs "
        f"(A median {statistics.median(p['a'] for p in pairs):.1f} us, "
        f"B median {statistics.median(p['b'] for p in pairs):.1f} us); the workers "
        f"(recorder, detector) {workers['a']:.1f} and {workers['b']:.1f} us a request"
    )


def _workers_cpu(pid: int) -> float:
    """The CPU of the serving process's children so far (ended ones are not counted)."""
    return cpu_seconds(pid) - _own_cpu(pid)


@contextmanager
def _side(tmp: Path, name: str, tree: Path) -> Iterator[tuple[str, int]]:
    """One version's proxy and its two stubs: its base URL and pid."""
    primary, candidate, port = free_port(), free_port(), free_port()
    with ExitStack() as stack:
        for stub in (primary, candidate):
            stack.enter_context(process(pinned(1, cheapest_stub_argv(tmp, stub, "c")), stub))
        cfg = tmp / f"{name}.yaml"
        kvmigrate_config(
            cfg,
            port,
            f"http://127.0.0.1:{primary}",
            shadow_sample=1.0,
            full=True,
            candidate=f"http://127.0.0.1:{candidate}",
        )
        argv = [sys.executable, "-m", "kvmigrate", "proxy", "--config", str(cfg), "--workers", "1"]
        proxy = stack.enter_context(process(pinned(0, argv), port, env={"PYTHONPATH": str(tree)}))
        yield f"http://127.0.0.1:{port}", proxy.pid


def _window_cost(wrk: str, script: Path, base: str, pid: int, seconds: float) -> tuple[float, int]:
    """The serving process's CPU per request, in microseconds, over one window of load,
    and the requests served in it."""
    before = _own_cpu(pid)
    served = _serve(wrk, script, base, seconds)
    return (_own_cpu(pid) - before) / served * 1e6, served


def _own_cpu(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def _serve(wrk: str, script: Path, base: str, seconds: float) -> int:
    argv = [wrk, "-t1", "-c64", f"-d{seconds:g}s", "-s", str(script)]
    argv.append(base + "/v1/chat/completions")
    out = subprocess.run(pinned(1, argv), capture_output=True, text=True, check=True).stdout
    if "Non-2xx" in out:
        raise RuntimeError(f"wrk saw errors:\n{out}")
    match = re.search(r"(\d+) requests in", out)
    if match is None:
        raise RuntimeError(f"no request count in wrk's output:\n{out}")
    return int(match.group(1))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", type=Path, required=True, help="the baseline tree")
    parser.add_argument("--b", type=Path, required=True, help="the tree to compare")
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--window", type=float, default=2.0, help="seconds of load per sample")
    return parser.parse_args()


if __name__ == "__main__":
    main()
