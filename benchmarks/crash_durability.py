"""Records after a crash, on a busy machine: answers served against answers recorded.

    python benchmarks/crash_durability.py [--load-seconds 4] [--concurrency 8] [--hogs N]

Two emulators (`kvmigrate emulate`) and the proxy (`kvmigrate proxy --config ...`, shadow
mode, recorder on, record.durability spool) run as processes of their own, beside a CPU hog
on every core (busy-looping processes at the proxy's own priority). A loopback load
generator sends chat completions; each answer's `x-request-id` and the time its client had
it are kept.

single  the proxy (one process) is killed with SIGKILL under load, then started again: its
        recorder workers must exit with it, and the restart writes its spool back. Lost:
        answers the clients had and the records lack; `lost_before_last_1s` must be 0.
        `counted_missing` is what `kvmigrate report` says has no record, and
        `unclean_stops` the crashes it notes.
pool    `--workers 2`: one serving worker is killed with SIGKILL under load; the pool starts
        another, whose recorder writes the dead one's spool. The load goes on, then stops,
        and the idle pool is stopped (SIGTERM, --drain-seconds 5): `stop_s` should be about
        the drain plus the recorder's few seconds, never the parent's kill at drain + 10 s.
        `orphans_gone_s`: how long the killed worker's recorder processes outlived it.

Figures are counts and seconds of this run; a busy machine only makes the waits longer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
import psutil  # type: ignore[import-untyped]
from soak import (
    HOSTED_MODEL,
    VLLM_MODEL,
    ChildProcess,
    emulator_process,
    fetch_metrics,
    metric_sum,
)

from kvmigrate.serving import free_port

Action = Callable[[], float]
SETTLE_S = 90.0  # the longest the records may take to land after the load
DRAIN_S = 5.0


@dataclass
class Answers:
    """What the clients had: request id -> the time (Unix s) the answer was whole."""

    done: dict[str, float] = field(default_factory=dict)
    errors: int = 0


@dataclass
class Outcome:
    scenario: str
    served: int = 0
    recorded: int = 0
    lost: int = 0
    lost_before_last_1s: int = 0
    oldest_lost_ms: float | None = None  # how long before the kill the oldest lost answer was
    counted_missing: int | None = None
    unclean_stops: int | None = None
    replayed: float | None = None
    backlog_at_kill: float | None = None  # records spooled, not yet written, at the kill
    written_at_kill: float | None = None
    raised_at_kill: float | None = None  # times the recorder's work was raised so far
    orphans_gone_s: float | None = None  # the last of the killed process's workers to exit
    orphans: list[list[object]] = field(default_factory=list)  # each: [priority, seconds]
    stop_s: float | None = None
    client_errors: int = 0


@contextlib.contextmanager
def cpu_hogs(count: int) -> Iterator[None]:
    """`count` processes that keep a core busy each, at the proxy's priority."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait(10)


def write_config(root: Path, hosted: int, vllm: int) -> Path:
    config = root / "config.yaml"
    config.write_text(
        f"""
backends:
  hosted: {{api_base: "http://127.0.0.1:{hosted}/v1"}}
  vllm: {{api_base: "http://127.0.0.1:{vllm}/v1"}}
models:
  - {{model_name: {HOSTED_MODEL}, hosted: {HOSTED_MODEL}, vllm: {VLLM_MODEL}}}
rollout: {{mode: shadow, state: "sqlite:///{root}/state.db"}}
record: {{db: "sqlite:///{root}/records.db", content: redacted, durability: spool}}
"""
    )
    return config


def proxy(config: Path, log: Path, workers: int) -> ChildProcess:
    port = free_port()
    args = ["proxy", "--config", str(config), "--port", str(port), "--workers", str(workers),
            "--drain-seconds", str(DRAIN_S)]  # fmt: skip
    return ChildProcess(args, port, log)


async def load(
    url: str, seconds: float, concurrency: int, answers: Answers, at: float, action: Action
) -> float:
    """Requests for `seconds`; `at` seconds in, `action` runs (on a thread, the load going
    on) and the time it ran is returned. A refused or broken request (the proxy just
    killed) counts as an error and is sent again."""
    deadline = time.monotonic() + seconds
    counter = iter(range(1 << 30))

    async def client(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < deadline:
            i = next(counter)
            body = {"model": HOSTED_MODEL, "messages": [{"role": "user", "content": f"q{i}"}],
                    "max_tokens": 8, "user": f"u{i % 50}"}  # fmt: skip
            try:
                async with session.post(url + "/v1/chat/completions", json=body) as response:
                    await response.read()
                    if response.status == 200:
                        answers.done[response.headers["x-request-id"]] = time.time()
                        continue
            except (TimeoutError, aiohttp.ClientError):
                pass
            answers.errors += 1
            await asyncio.sleep(0.01)

    async def act() -> float:
        await asyncio.sleep(at)
        return await asyncio.to_thread(action)

    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        acted, *_ = await asyncio.gather(act(), *(client(session) for _ in range(concurrency)))
    return float(acted)


def recorded_ids(db: Path) -> set[str]:
    if not db.exists():
        return set()
    with contextlib.closing(sqlite3.connect(db, timeout=30)) as conn:
        try:
            return {r[0] for r in conn.execute("SELECT request_id FROM records WHERE role='serve'")}
        except sqlite3.OperationalError:  # not migrated yet
            return set()


def settle(db: Path, answers: Answers) -> set[str]:
    """The served answers' records, once all are in or none more came for 30 s."""
    deadline, last_change, seen = time.monotonic() + SETTLE_S, time.monotonic(), -1
    while True:
        found = recorded_ids(db) & answers.done.keys()
        if len(found) != seen:
            seen, last_change = len(found), time.monotonic()
        now = time.monotonic()
        if len(found) == len(answers.done) or now > deadline or now - last_change > 30:
            return found
        time.sleep(0.25)


def judge(outcome: Outcome, answers: Answers, found: set[str], killed_at: float) -> None:
    """Counted over the answers of the load (the warm-up's are not in `answers`)."""
    lost = {rid: t for rid, t in answers.done.items() if rid not in found}
    outcome.served, outcome.recorded, outcome.lost = len(answers.done), len(found), len(lost)
    outcome.lost_before_last_1s = sum(1 for t in lost.values() if t < killed_at - 1.0)
    if lost:
        outcome.oldest_lost_ms = round((killed_at - min(lost.values())) * 1000, 1)
    outcome.client_errors = answers.errors


def report_figures(config: Path, outcome: Outcome) -> None:
    """What `kvmigrate report` says: answers without a record, and crashes noted."""
    result = subprocess.run(
        [sys.executable, "-m", "kvmigrate", "report", "--config", str(config), "--since", "1h",
         "--format", "json"], capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    completeness = json.loads(result.stdout)["completeness"]
    outcome.counted_missing = completeness["missing"]
    outcome.unclean_stops = completeness["unclean_stops"]


def spawned_children(pid: int) -> list[psutil.Process]:
    found = []
    for child in psutil.Process(pid).children():
        with contextlib.suppress(psutil.Error):
            command = " ".join(child.cmdline())
            if "spawn_main" in command and "resource_tracker" not in command:
                found.append(child)
    return found


def gone_after(processes: list[psutil.Process], since: float) -> dict[int, float | None]:
    """Seconds from `since` until each process has exited (None: still running after 30 s).
    A zombie has exited: its reaping is up to whoever inherited it."""

    def running(process: psutil.Process) -> bool:
        try:
            return process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    gone: dict[int, float | None] = {p.pid: None for p in processes}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for process in processes:
            if gone[process.pid] is None and not running(process):
                gone[process.pid] = round(time.time() - since, 2)
        if all(t is not None for t in gone.values()):
            break
        time.sleep(0.02)
    return gone


def priority(process: psutil.Process) -> str:
    """`idle` (SCHED_IDLE) or `nice N`, of the process's main thread."""
    with contextlib.suppress(OSError, psutil.Error):
        if os.sched_getscheduler(process.pid) == os.SCHED_IDLE:
            return "idle"
        return f"nice {process.nice()}"
    return "gone"


def warm_up(url: str, db: Path) -> None:
    """A few answers, and their records written: the recorder's workers are up (a worker
    killed while its interpreter still starts cannot yet ask to die with its parent)."""
    answers = Answers()
    asyncio.run(load(url, 1.0, 2, answers, 0.0, time.time))
    deadline = time.monotonic() + 120
    while not recorded_ids(db) & answers.done.keys() and time.monotonic() < deadline:
        time.sleep(0.2)


def wait_noted(db: Path, timeout: float = 60.0) -> None:
    """Until the replay of a dead process's spool has noted its crash (unclean_stops)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with (
            contextlib.suppress(sqlite3.OperationalError),
            contextlib.closing(sqlite3.connect(db, timeout=30)) as conn,
        ):
            if conn.execute("SELECT count(*) FROM unclean_stops").fetchone()[0]:
                return
        time.sleep(0.25)


def kill_with_figures(process: ChildProcess, outcome: Outcome) -> float:
    """The recorder's state, then SIGKILL; the time of the kill."""
    metrics = fetch_metrics(process.url)
    outcome.backlog_at_kill = metric_sum(metrics, "kvmigrate_recorder_queue_depth")
    outcome.written_at_kill = metric_sum(metrics, "kvmigrate_records_written_total")
    outcome.raised_at_kill = metric_sum(metrics, "kvmigrate_recorder_raised_total")
    return kill_watching(psutil.Process(process.pid), outcome)


def kill_watching(victim: psutil.Process, outcome: Outcome) -> float:
    """SIGKILL to `victim`, and a thread that times how long its worker processes outlive
    it (`orphans_gone_s`); the time of the kill."""
    orphans = spawned_children(victim.pid)
    priorities = {p.pid: priority(p) for p in orphans}
    killed_at = time.time()
    victim.kill()

    def watch() -> None:
        gone = gone_after(orphans, killed_at)
        outcome.orphans = [[priorities[pid], seconds] for pid, seconds in gone.items()]
        times = list(gone.values())
        outcome.orphans_gone_s = None if None in times else max(times, default=0.0)

    threading.Thread(target=watch, daemon=True).start()
    return killed_at


def run_single(root: Path, config: Path, args: argparse.Namespace) -> Outcome:
    outcome, answers = Outcome("single"), Answers()
    first = proxy(config, root / "proxy1.log", workers=1).start(timeout=120)
    warm_up(first.url, root / "records.db")
    with cpu_hogs(args.hogs):
        seconds = args.load_seconds

        def kill() -> float:
            return kill_with_figures(first, outcome)

        run = load(first.url, seconds + 1, args.concurrency, answers, seconds, kill)
        killed_at = asyncio.run(run)
        first.kill()  # reaped
        second = proxy(config, root / "proxy2.log", workers=1).start(timeout=120)
        found = settle(root / "records.db", answers)
        wait_noted(root / "records.db")
        outcome.replayed = metric_sum(fetch_metrics(second.url), "kvmigrate_records_replayed_total")
        started = time.monotonic()
        second.stop(timeout=60)
        outcome.stop_s = round(time.monotonic() - started, 2)
    judge(outcome, answers, found, killed_at)
    report_figures(config, outcome)
    return outcome


def run_pool(root: Path, config: Path, args: argparse.Namespace) -> Outcome:
    outcome, answers = Outcome("pool"), Answers()
    pool = proxy(config, root / "pool.log", workers=2).start(timeout=180)
    warm_up(pool.url, root / "records.db")
    with cpu_hogs(args.hogs):

        def kill() -> float:
            # A serving worker: one of the pool's own children.
            return kill_watching(spawned_children(pool.pid)[0], outcome)

        seconds = args.load_seconds
        run = load(pool.url, seconds, args.concurrency, answers, seconds / 2, kill)
        killed_at = asyncio.run(run)
        found = settle(root / "records.db", answers)
        wait_noted(root / "records.db")
        outcome.replayed = metric_sum(fetch_metrics(pool.url), "kvmigrate_records_replayed_total")
        started = time.monotonic()
        pool.stop(timeout=60)
        outcome.stop_s = round(time.monotonic() - started, 2)
    judge(outcome, answers, found, killed_at)
    report_figures(config, outcome)
    return outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load-seconds", type=float, default=4.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--hogs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--scenarios", default="single,pool")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    outcomes = []
    for scenario in args.scenarios.split(","):
        with tempfile.TemporaryDirectory(prefix="kvmigrate-crash-") as tmp:
            root = Path(tmp)
            hosted = emulator_process("hosted", free_port(), 0.0, root / "hosted.log")
            vllm = emulator_process("vllm", free_port(), 0.0, root / "vllm.log")
            with hosted.start(), vllm.start():
                config = write_config(root, hosted.port, vllm.port)
                run = run_single if scenario == "single" else run_pool
                outcomes.append(run(root, config, args))
        print(json.dumps(asdict(outcomes[-1])), flush=True)
    if args.json:
        args.json.write_text(json.dumps([asdict(o) for o in outcomes], indent=2))
    return 0 if all(o.lost_before_last_1s == 0 for o in outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
