"""`kvmigrate proxy --workers N`: N proxy processes on one port, as uvicorn's and LiteLLM's
`--workers` run.

Each worker is a whole proxy (the `build` it is given: `runtime.build_app`, passed in by the
CLI, so the proxy package knows nothing of what is wired around it): it listens with
SO_REUSEPORT, so the kernel spreads connections among the workers; it follows the rollout
store on its own (a change reaches every worker within the store's poll interval); it writes
to the shared records store (SQLite in WAL mode with a busy timeout, or postgres); and its
metrics go to a folder the parent creates, where a scrape of any worker sums them
(`pool_metrics`). The parent serves nothing: it starts the workers, starts another when one
dies, and on SIGTERM or Ctrl-C tells them to stop accepting and finish what they are serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING

from kvmigrate.background import WorkerGone, WorkerProcess
from kvmigrate.config import Config
from kvmigrate.continuity.link_table import ENV as LINK_TABLE_ENV
from kvmigrate.continuity.link_table import create_table
from kvmigrate.proxy.pool_metrics import (
    MULTIPROC_ENV,
    forget_worker,
    keep_snapshot,
    new_pool_directory,
)
from kvmigrate.serving import DRAIN_S, StopRequests, install_fast_event_loop, serve_until

if TYPE_CHECKING:
    from aiohttp import web

# Each worker's app from the config; picklable (a module's function), as the workers are
# spawned. An exception of one of the `Refusals` types it raises is a reason the operator
# must act on (a store that cannot be opened): the parent says it once and stops.
AppBuilder = Callable[[Config], "web.Application"]
Refusals = tuple[type[Exception], ...]

log = logging.getLogger("kvmigrate.proxy.pool")
READY_TIMEOUT_S = 60.0
WATCH_INTERVAL_S = 0.2
# After the drain, what a worker has to write its records before the parent kills it: an
# orchestrator's grace period must cover the drain and this (deploy/).
RECORDS_MARGIN_S = 10.0
_READY = "ready"


def default_workers() -> int:
    """The cores this process may use: its CPU affinity, bounded by a cgroup v2 CPU quota
    (a container's CPU limit), which `os.cpu_count()` ignores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = cores or 1
    with contextlib.suppress(OSError, ValueError):
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    return cores


def serve_pool(
    config: Config,
    host: str,
    port: int,
    workers: int,
    banner: str,
    level: str,
    drain_s: float = DRAIN_S,
    *,
    build: AppBuilder,
    refusals: Refusals = (),
) -> None:
    """Run `workers` proxy processes, each serving `build(config)`, on `host:port` until
    SIGINT or SIGTERM."""
    _check_port_free(host, port)
    directory = new_pool_directory()
    os.environ[MULTIPROC_ENV] = directory  # read by the workers, which inherit it
    os.environ[LINK_TABLE_ENV] = str(create_table(directory))
    stop = threading.Event()
    pool: list[WorkerProcess] = []

    def signalled(*_: object) -> None:
        if stop.is_set():  # asked again: the workers end what they serve now
            log.warning("asked again to stop: the workers end what is in flight now")
            for worker in pool:
                worker.terminate()
        stop.set()

    previous = {s: signal.signal(s, signalled) for s in (signal.SIGINT, signal.SIGTERM)}
    pool += [
        WorkerProcess(
            f"kvmigrate-proxy-{index}",
            "kvmigrate.proxy.pool:serve_worker",
            lambda: (config, host, port, level, drain_s, build, refusals),
            duplex=True,
            background=False,
        )
        for index in range(workers)
    ]
    try:
        for worker in pool:
            worker.start()
        for worker in pool:
            _wait_ready(worker)
        print(f"{banner}\n  {workers} worker processes (pids {_pids(pool)})", flush=True)
        while not stop.wait(WATCH_INTERVAL_S):
            for worker in pool:
                if not worker.running:
                    _replace(worker, directory)
    finally:
        _stop_all(pool, drain_s)
        shutil.rmtree(directory, ignore_errors=True)
        os.environ.pop(MULTIPROC_ENV, None)
        os.environ.pop(LINK_TABLE_ENV, None)
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _check_port_free(host: str, port: int) -> None:
    """Refuse a port something already listens on. The workers bind with SO_REUSEPORT, so a
    second pool started on the same port by mistake (same user) would bind as well and
    silently take half the connections; a bind without it fails as a single proxy's does."""
    try:
        for family, kind, proto, _, address in socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM
        ):
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(address)
    except OSError as exc:
        raise SystemExit(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def _pids(pool: list[WorkerProcess]) -> str:
    return ", ".join(str(worker.pid) for worker in pool)


def _wait_ready(worker: WorkerProcess) -> None:
    """Until the worker says it serves. Its pipe's end is no such word: a worker that died
    at start was counted ready, the banner printed, and the pool restarted it forever."""
    failed = f"proxy worker {worker.name} failed to start"
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not worker.poll(0.1):
        if not worker.running or time.monotonic() > deadline:
            raise SystemExit(f"{failed} (see its log above)")
    try:
        message = worker.receive()
    except WorkerGone:
        raise SystemExit(f"{failed} (see its log above)") from None
    if message != _READY:
        raise SystemExit(f"{failed}: {message}")


def _replace(worker: WorkerProcess, directory: str) -> None:
    pid = worker.pid
    if pid is not None:
        log.warning("proxy worker %s (pid %d) died; starting another", worker.name, pid)
        forget_worker(directory, pid)
    try:
        worker.restart()  # at most once per RESPAWN_S: a crash loop must not take the CPU
    except WorkerGone as exc:
        log.error("%s", exc)


def _stop_all(pool: list[WorkerProcess], drain_s: float) -> None:
    """Every worker stops accepting and drains at once; whatever still runs after the drain
    time (and a margin for writing its records) is killed."""
    for worker in pool:
        worker.finish()
    deadline = time.monotonic() + drain_s + RECORDS_MARGIN_S
    for worker in pool:
        worker.join(deadline - time.monotonic())
    for worker in pool:
        worker.close(0.0)


# -- in each worker ---------------------------------------------------------------------------


def serve_worker(
    conn: Connection,
    config: Config,
    host: str,
    port: int,
    level: str,
    drain_s: float,
    build: AppBuilder,
    refusals: Refusals,
) -> None:
    """A worker's main. Ctrl-C reaches the whole process group: the parent decides when its
    workers stop, and tells them (a message, or its end of the pipe closing when it dies)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    install_fast_event_loop()
    asyncio.run(_serve_worker(conn, config, host, port, drain_s, build, refusals))


async def _serve_worker(
    conn: Connection,
    config: Config,
    host: str,
    port: int,
    drain_s: float,
    build: AppBuilder,
    refusals: Refusals,
) -> None:
    from kvmigrate.proxy.app import SERVICE_KEY

    loop = asyncio.get_running_loop()
    # The parent's stop message and a SIGTERM are both stop requests, in whichever order
    # they come: the second one (the operator asked again) ends what is in flight now.
    asked = StopRequests()
    loop.add_signal_handler(signal.SIGTERM, asked.signalled)

    def parent_spoke() -> None:  # a stop message, or EOF: either way, drain and end
        loop.remove_reader(conn.fileno())
        asked.signalled()

    loop.add_reader(conn.fileno(), parent_spoke)
    try:
        app = build(config)
    except refusals as exc:
        # A reason the operator must act on (a store that cannot be opened): the parent
        # says it once and stops, rather than each worker dying with a traceback.
        conn.send(str(exc))
        return
    directory = os.environ[MULTIPROC_ENV]
    live = app[SERVICE_KEY].metrics.registry.live
    snapshots: list[asyncio.Task[None]] = []

    def ready() -> None:
        snapshots.append(loop.create_task(keep_snapshot(directory, live)))
        conn.send(_READY)

    try:
        await serve_until(
            app, host, port, asked.stop, ready, reuse_port=True, drain_s=drain_s, hurry=asked.hurry
        )
    finally:
        for task in snapshots:
            task.cancel()
