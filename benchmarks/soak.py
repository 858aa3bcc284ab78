"""A bounded soak on loopback: the real proxy process under a steady load, watched over time.

    .venv/bin/python benchmarks/soak.py [--duration 300] [--rate 50] [--interval 10]

Two emulators (`kvmigrate emulate`, hosted and vllm profiles) and one proxy
(`kvmigrate proxy --config ...`: shadow mode at sample 1.0, recorder on) run as separate
processes, so the proxy's RSS and file descriptors are its own. An open-loop generator in
this process sends `--rate` requests per second (half of them streamed) for `--duration`
seconds; every `--interval` seconds it prints the interval's p50/p99 latency, the proxy's
RSS and open fds, dropped shadow copies, the recorder backlog and dropped records.

Verdict, at the end: PASS when there were no errors, no growth trend in RSS or fds over the
second half, and every request is accounted for: each answer and each shadow copy is in the
records DB or counted as dropped (`kvmigrate_shadow_dropped_total`,
`kvmigrate_records_dropped_total`). Exit status 0 on PASS, 1 on FAIL. It stops by itself.
The reliability test (tests/reliability/test_soak.py) runs the same code for ~30 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO

import aiohttp
import psutil  # type: ignore[import-untyped]

from kvmigrate.serving import free_port

HOSTED_MODEL = "gpt-4o-mini"
VLLM_MODEL = "meta-llama/Llama-3.1-8B-Instruct"


# --- processes and metrics (also used by tests/reliability) ------------------------------------


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text format -> {'name{labels}': value}; comments skipped."""
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        with contextlib.suppress(ValueError):
            samples[head] = float(value)
    return samples


def metric_sum(samples: dict[str, float], name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    total = 0.0
    for head, value in samples.items():
        if head != name and not head.startswith(name + "{"):
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += value
    return total


def fetch_metrics(base_url: str, timeout: float = 5.0) -> dict[str, float]:
    with urllib.request.urlopen(base_url + "/metrics", timeout=timeout) as response:
        return parse_metrics(response.read().decode())


class ChildProcess:
    """A `python -m kvmigrate ...` child with its output in a log file (a pipe nobody reads
    would fill up and block the child under load)."""

    def __init__(self, args: list[str], port: int, log_path: Path, pipe: bool = False) -> None:
        self.args = args
        self.port = port
        self.log_path = log_path
        # pipe: output to a pipe, collected at stop(), for a child whose file writes are
        # meant to fail (a pipe is not subject to RLIMIT_FSIZE); it must log little.
        self.pipe = pipe
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._captured = b""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def start(self, ready_path: str = "/health", timeout: float = 30.0) -> ChildProcess:
        self._log = None if self.pipe else self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kvmigrate", *self.args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if self.pipe else self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.args[0]} exited at start:\n{self.output()[-3000:]}")
            try:
                with urllib.request.urlopen(self.url + ready_path, timeout=1) as response:
                    if response.status == 200:
                        return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.args[0]} not ready:\n{self.output()[-3000:]}")
            time.sleep(0.05)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def output(self) -> str:
        if self.pipe:
            return self._captured.decode(errors="replace")
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        """SIGKILL: no flush, no cleanup, as a crash or an OOM kill."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self._close_log()

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM (a graceful shutdown that flushes the recorder); SIGKILL if it hangs."""
        code = None
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()
            try:
                code = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                code = self.proc.wait(10)
        self._close_log()
        return code

    def _close_log(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self._captured += self.proc.stdout.read()
            self.proc.stdout.close()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> ChildProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def proxy_process(config_path: Path, port: int, log_path: Path, pipe: bool = False) -> ChildProcess:
    """`kvmigrate proxy` as an operator runs it (runtime.build_app), in one process: the
    soak follows that process's memory and descriptors, and the reliability tests kill it,
    or fill its disk, as a crash or a full disk would."""
    args = ["proxy", "--config", str(config_path), "--port", str(port), "--workers", "1"]
    return ChildProcess(args, port, log_path, pipe)


def emulator_process(profile: str, port: int, time_scale: float, log_path: Path) -> ChildProcess:
    args = ["emulate", "--profile", profile, "--port", str(port), "--time-scale", str(time_scale)]
    return ChildProcess(args, port, log_path)


def count_rows(db: Path, sql: str, params: tuple[object, ...] = ()) -> int:
    with contextlib.closing(sqlite3.connect(db, timeout=10)) as conn:
        return int(conn.execute(sql, params).fetchone()[0])


# --- the load ----------------------------------------------------------------------------------


@dataclass
class Sample:
    """One interval of the run."""

    t: float
    sent: int
    ok: int
    errors: int
    p50_ms: float
    p99_ms: float
    rss_mb: float
    fds: int
    shadow_dropped: float
    queue_depth: float
    records_dropped: float


@dataclass
class Thresholds:
    """What counts as growth. RSS: the last quarter's mean may exceed the second quarter's
    by `rss_growth` (a share) plus `rss_slack_mb`; fds: the last quarter's max may exceed the
    second quarter's max by `fd_slack`. The first quarter is warm-up (pools, caches). A
    latency spike legitimately grows the upstream pools by a few dozen keep-alive
    connections; a leak of one fd per request at 50 req/s adds hundreds per quarter."""

    rss_growth: float = 0.05
    rss_slack_mb: float = 8.0
    fd_slack: int = 32
    max_error_share: float = 0.0


@dataclass
class SoakResult:
    duration_s: float
    rate: float
    warmup: int = 0
    sent: int = 0
    ok: int = 0
    errors: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    rss: list[tuple[float, float]] = field(default_factory=list)  # (t, MB), every second
    fds: list[tuple[float, int]] = field(default_factory=list)
    serve_rows: int = 0
    shadow_rows: int = 0
    shadow_dropped: float = 0.0
    records_dropped: float = 0.0
    rss_slope_mb_per_min: float = 0.0
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures


def _request_body(i: int, stream: bool) -> bytes:
    body: dict[str, object] = {
        "model": HOSTED_MODEL,
        "messages": [
            {"role": "system", "content": "You are a coding agent in a soak test."},
            {"role": "user", "content": f"step {i}: read the failing test and propose a fix"},
        ],
        "max_tokens": 16,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body).encode()


async def _one(
    session: aiohttp.ClientSession, url: str, i: int, stream: bool, conversations: int
) -> tuple[float, str | None]:
    """One request; (latency s, error kind or None). A stream must end with [DONE] and carry
    no error event: a silently truncated answer is an error too."""
    started = time.perf_counter()
    # A bounded pool of conversations, as a fleet of agents: per-conversation state in the
    # proxy (cache-buster tracking) reaches a steady size instead of growing by design.
    session_id = f"soak-{i % conversations}"
    headers = {"Content-Type": "application/json", "X-Session-ID": session_id}
    try:
        async with session.post(url, data=_request_body(i, stream), headers=headers) as response:
            body = await response.read()
            if response.status != 200:
                return time.perf_counter() - started, f"http_{response.status}"
            if stream and (b"data: [DONE]" not in body or b'"error"' in body):
                return time.perf_counter() - started, "bad_stream"
            if not stream and b'"choices"' not in body:
                return time.perf_counter() - started, "bad_body"
    except (aiohttp.ClientError, TimeoutError) as exc:
        return time.perf_counter() - started, type(exc).__name__
    return time.perf_counter() - started, None


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope (units per second)."""
    if len(points) < 3:
        return 0.0
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else 0.0


async def drive(
    proxy_url: str,
    pid: int,
    duration: float,
    rate: float,
    stream_share: float,
    interval: float,
    conversations: int = 200,
    warmup: int = 2500,
    max_inflight: int = 500,
    echo: bool = True,
) -> SoakResult:
    """Open-loop load: request i starts at i / rate whatever the proxy does, so a slow proxy
    shows up as latency (and in-flight growth), not as a politely lower rate."""
    result = SoakResult(duration_s=duration, rate=rate)
    process = psutil.Process(pid)
    url = proxy_url + "/v1/chat/completions"
    latencies: list[float] = []
    interval_errors = 0
    inflight: set[asyncio.Task[None]] = set()
    connector = aiohttp.TCPConnector(limit=max_inflight)
    timeout = aiohttp.ClientTimeout(total=30)

    async def run_one(i: int, stream: bool) -> None:
        nonlocal interval_errors
        latency, error = await _one(session, url, i, stream, conversations)
        if error is None:
            result.ok += 1
            latencies.append(latency)
        else:
            result.errors += 1
            interval_errors += 1
            result.error_kinds[error] = result.error_kinds.get(error, 0) + 1

    def sample_process(t: float) -> tuple[float, int]:
        rss = process.memory_info().rss / 2**20
        fds = process.num_fds()
        result.rss.append((t, rss))
        result.fds.append((t, fds))
        return rss, fds

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        # Warm-up, closed loop and as fast as the proxy goes: fills the proxy's bounded
        # caches (the recorder keeps the last 2,000 shadowed answers for parity scoring),
        # so that growth by design is over before the trend is measured.
        warm_started = time.perf_counter()
        # 24 at a time keeps shadow copies in flight under the proxy's default bound (64),
        # so the warm-up itself drops none.
        for first in range(0, warmup, 24):
            batch = range(first, min(first + 24, warmup))
            await asyncio.gather(*(run_one(-1 - j, j % 2 == 0) for j in batch))
        result.warmup = result.sent = result.ok + result.errors
        latencies.clear()
        if echo and warmup:
            print(
                f"warm-up: {result.warmup} requests in {time.perf_counter() - warm_started:.1f}s",
                flush=True,
            )
        if echo:
            print(
                f"{'t(s)':>6} {'sent':>6} {'ok':>6} {'err':>4} {'p50ms':>7} {'p99ms':>7} "
                f"{'rss MB':>7} {'fds':>4} {'shadow_drop':>11} {'rec_queue':>9} {'rec_drop':>8}",
                flush=True,
            )
        loop = asyncio.get_running_loop()
        start = loop.time()
        next_sample = next_probe = 0.0
        i = 0
        # Every stream_share-th request streams, spread evenly rather than at random.
        stream_every = round(1 / stream_share) if stream_share > 0 else 0
        while (now := loop.time() - start) < duration:
            due = int(now * rate) + 1
            while i < due:
                if len(inflight) >= max_inflight:
                    result.errors += 1  # the proxy fell this far behind: an error, not a wait
                    result.error_kinds["overload"] = result.error_kinds.get("overload", 0) + 1
                else:
                    stream = stream_every > 0 and i % stream_every == 0
                    task = loop.create_task(run_one(i, stream))
                    inflight.add(task)
                    task.add_done_callback(inflight.discard)
                result.sent += 1
                i += 1
            if now >= next_probe:
                next_probe += 1.0
                rss, fds = sample_process(now)
            if now >= next_sample + interval:
                next_sample += interval
                rss, fds = sample_process(now)
                metrics = await asyncio.to_thread(fetch_metrics, proxy_url)
                sample = Sample(
                    t=round(now, 1),
                    sent=result.sent,
                    ok=result.ok,
                    errors=interval_errors,
                    p50_ms=_pct(latencies, 0.5) * 1000,
                    p99_ms=_pct(latencies, 0.99) * 1000,
                    rss_mb=rss,
                    fds=fds,
                    shadow_dropped=metric_sum(metrics, "kvmigrate_shadow_dropped_total"),
                    queue_depth=metric_sum(metrics, "kvmigrate_recorder_queue_depth"),
                    records_dropped=metric_sum(metrics, "kvmigrate_records_dropped_total"),
                )
                result.samples.append(sample)
                latencies.clear()
                interval_errors = 0
                if echo:
                    print(
                        f"{sample.t:>6.0f} {sample.sent:>6} {sample.ok:>6} {sample.errors:>4} "
                        f"{sample.p50_ms:>7.1f} {sample.p99_ms:>7.1f} {sample.rss_mb:>7.1f} "
                        f"{sample.fds:>4} {sample.shadow_dropped:>11.0f} "
                        f"{sample.queue_depth:>9.0f} {sample.records_dropped:>8.0f}",
                        flush=True,
                    )
            await asyncio.sleep(min(1 / rate, 0.02))
        if inflight:
            await asyncio.wait(set(inflight), timeout=35)
    return result


def _accounted(metrics: dict[str, float]) -> float:
    """Records the proxy has written or counted as dropped, and shadow copies it dropped
    before they started (those have no record): what `judge` holds against 2 x answered."""
    return (
        metric_sum(metrics, "kvmigrate_records_written_total")
        + metric_sum(metrics, "kvmigrate_records_dropped_total")
        + metric_sum(metrics, "kvmigrate_shadow_dropped_total")
    )


def _wait_drained(proxy_url: str, expected: int, timeout: float = 180.0) -> dict[str, float]:
    """Until no shadow copy is in flight and the proxy has written or counted as dropped
    `expected` records, by its own counters; the metrics then. The recorder runs at the
    lowest CPU priority, so beside a CPU hog it falls thousands of records behind the load
    (a 4,500-record backlog, drained at ~70 records/s, was seen): a fixed wait would count
    the rows while they are still queued. `timeout` only bounds a stuck writer; `judge`
    then reports what is missing."""
    deadline = time.monotonic() + timeout
    while True:
        metrics = fetch_metrics(proxy_url)
        idle = metric_sum(metrics, "kvmigrate_shadow_inflight") == 0
        if (idle and _accounted(metrics) >= expected) or time.monotonic() > deadline:
            return metrics
        time.sleep(0.2)


def judge(result: SoakResult, thresholds: Thresholds) -> None:
    """Fill `result.failures` (empty means PASS)."""
    failures = result.failures
    allowed = int(thresholds.max_error_share * result.sent)
    if result.errors > allowed:
        failures.append(f"{result.errors} errors (allowed {allowed}): {result.error_kinds}")
    # Growth: compare the second quarter (after warm-up) with the last one.
    n = len(result.rss)
    if n >= 8:
        q2 = [mb for _, mb in result.rss[n // 4 : n // 2]]
        q4 = [mb for _, mb in result.rss[3 * n // 4 :]]
        limit = statistics.fmean(q2) * (1 + thresholds.rss_growth) + thresholds.rss_slack_mb
        if statistics.fmean(q4) > limit:
            failures.append(
                f"RSS grows: last quarter {statistics.fmean(q4):.1f} MB > {limit:.1f} MB "
                f"(second quarter {statistics.fmean(q2):.1f} MB)"
            )
        fd2 = max(f for _, f in result.fds[n // 4 : n // 2])
        fd4 = max(f for _, f in result.fds[3 * n // 4 :])
        if fd4 > fd2 + thresholds.fd_slack:
            failures.append(f"fds grow: last quarter max {fd4} > {fd2} + {thresholds.fd_slack}")
        result.rss_slope_mb_per_min = _slope(result.rss[n // 2 :]) * 60
    else:
        failures.append(f"too few samples ({n}) to judge a trend")
    # Accounting: each answered request is one serve record, and one shadow copy, each
    # written or counted as dropped. A copy dropped before it started (concurrency limit,
    # timeout) has no exchange, so it is counted in shadow_dropped, not in the records.
    answered = result.ok + result.error_kinds.get("bad_stream", 0)
    expected = 2 * answered
    accounted = (
        result.serve_rows + result.shadow_rows + result.records_dropped + result.shadow_dropped
    )
    if accounted < expected:
        failures.append(
            f"lost records: {result.serve_rows} serve + {result.shadow_rows} shadow rows + "
            f"{result.records_dropped:.0f} dropped records + {result.shadow_dropped:.0f} "
            f"dropped copies < 2 x {answered} answered"
        )
    if result.serve_rows + result.records_dropped < answered:
        failures.append(f"serve records {result.serve_rows} < {answered} answered")


def run_soak(
    workdir: Path,
    duration: float = 300.0,
    rate: float = 50.0,
    stream_share: float = 0.5,
    interval: float = 10.0,
    time_scale: float = 0.02,
    conversations: int = 200,
    warmup: int = 2500,
    thresholds: Thresholds | None = None,
    echo: bool = True,
) -> SoakResult:
    thresholds = thresholds or Thresholds()
    workdir.mkdir(parents=True, exist_ok=True)
    db = workdir / "records.db"
    hosted_port, vllm_port, proxy_port = free_port(), free_port(), free_port()
    config = workdir / "config.yaml"
    config.write_text(
        f"""
server: {{host: 127.0.0.1, port: {proxy_port}}}
backends:
  hosted: {{api_base: "http://127.0.0.1:{hosted_port}/v1", read_timeout: 10}}
  vllm: {{api_base: "http://127.0.0.1:{vllm_port}/v1", read_timeout: 10}}
models:
  - {{model_name: {HOSTED_MODEL}, hosted: {HOSTED_MODEL}, vllm: {VLLM_MODEL}}}
rollout:
  mode: shadow
  shadow_sample: 1.0
  noise_sample: 0.0
  state: "sqlite:///{workdir}/state.db"
record: {{db: "sqlite:///{db}", content: redacted}}
"""
    )
    hosted = emulator_process("hosted", hosted_port, time_scale, workdir / "hosted.log")
    vllm = emulator_process("vllm", vllm_port, time_scale, workdir / "vllm.log")
    proxy = proxy_process(config, proxy_port, workdir / "proxy.log")
    with hosted.start("/v1/models"), vllm.start("/v1/models"), proxy.start():
        result = asyncio.run(
            drive(
                proxy.url,
                proxy.pid,
                duration,
                rate,
                stream_share,
                interval,
                conversations=conversations,
                warmup=warmup,
                echo=echo,
            )
        )
        answered = result.ok + result.error_kinds.get("bad_stream", 0)
        final = _wait_drained(proxy.url, expected=2 * answered)
        result.shadow_dropped = metric_sum(final, "kvmigrate_shadow_dropped_total")
        result.records_dropped = metric_sum(final, "kvmigrate_records_dropped_total")
        result.serve_rows = count_rows(db, "SELECT count(*) FROM records WHERE role = 'serve'")
        result.shadow_rows = count_rows(db, "SELECT count(*) FROM records WHERE role = 'shadow'")
        if not proxy.alive():
            result.failures.append("the proxy died")
    if "Traceback" in proxy.output():
        result.failures.append("the proxy logged a traceback")
    judge(result, thresholds)
    if echo:
        print(render_summary(result), flush=True)
    return result


def render_summary(result: SoakResult) -> str:
    rss = [mb for _, mb in result.rss]
    fds = [f for _, f in result.fds]
    lines = [
        f"sent {result.sent} at {result.rate:g}/s for {result.duration_s:g}s: "
        f"{result.ok} ok, {result.errors} errors {result.error_kinds or ''}",
        f"records: {result.serve_rows} serve + {result.shadow_rows} shadow rows; "
        f"dropped: {result.records_dropped:.0f} records, {result.shadow_dropped:.0f} shadow copies",
        f"RSS {min(rss, default=0):.1f}..{max(rss, default=0):.1f} MB "
        f"(second-half slope {result.rss_slope_mb_per_min:+.2f} MB/min); "
        f"fds {min(fds, default=0)}..{max(fds, default=0)}",
        "PASS" if result.passed else "FAIL: " + "; ".join(result.failures),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of load")
    parser.add_argument("--rate", type=float, default=50.0, help="requests per second")
    parser.add_argument("--stream-share", type=float, default=0.5)
    parser.add_argument("--interval", type=float, default=10.0, help="seconds per table row")
    parser.add_argument("--time-scale", type=float, default=0.02, help="emulator delays")
    parser.add_argument("--conversations", type=int, default=200, help="agent sessions")
    parser.add_argument("--warmup", type=int, default=2500, help="requests before measuring")
    parser.add_argument("--workdir", type=Path, help="keep config, logs and DB here")
    parser.add_argument("--json", type=Path, help="also write the result as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kvmigrate-soak-") as tmp:
        result = run_soak(
            args.workdir or Path(tmp),
            duration=args.duration,
            rate=args.rate,
            stream_share=args.stream_share,
            interval=args.interval,
            time_scale=args.time_scale,
            conversations=args.conversations,
            warmup=args.warmup,
        )
    if args.json:
        args.json.write_text(json.dumps(asdict(result), indent=2))
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
