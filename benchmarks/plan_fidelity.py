"""How close `kvmigrate plan` comes to a real engine: the vLLM CPU build of the test bed.

1. Start real vLLM (the test bed's "bench" model shape, prefix caching on), warm it up, and
   probe it with `kvmigrate plan`'s calibration probe.
2. Record workload A (multi-turn conversations, several at once) through the kvmigrate
   proxy with `content: none`, exactly as a pilot records traffic.
3. Replay the records through the simulator (one replica, the server's KV cache and token
   budget) and compare its TTFT p50 by turn and prefix-cache hit rate with what the
   clients measured and the server reported: with the probe's cost model, and with the
   probe's model refined on A's own records ("calibrate on it", as issue 22 puts it).
4. Do the same for workload B (other turn count, other concurrency) with the same two
   cost models, and run A a second time: how far two runs of one workload land apart is
   the measurement's own spread, a floor for any prediction.

    python benchmarks/plan_fidelity.py
    python benchmarks/plan_fidelity.py --emulator   # the emulator's vLLM profile instead
    python benchmarks/plan_fidelity.py --save DIR   # keep the raw measurements ...
    python benchmarks/plan_fidelity.py --from DIR   # ... and compare them again, no engine
    python benchmarks/plan_fidelity.py --from DIR --against proxy   # ... with the TTFTs the
                                                    # proxy recorded, not the clients'

The measurements (the probe's turns, each workload's client-side turns and its records
store) are kept apart from the comparison, so a run on a quiet machine can be analysed,
and the simulator changed and checked again, on another.

The engine is measured as a GPU server would be, so that what the simulator models (the
engine's steps) is what the clients wait for, even on a 2-core machine:
- the engine's compute gets its own CPUs (`--engine-cpus`, half of them by default) and
  everything else the rest: the proxy, the clients, vLLM's API server;
- vLLM's worker runs inside its engine process (`--distributed-executor-backend uni`),
  so no process busy-polls a queue on the clients' CPUs;
- the proxy runs as `kvmigrate proxy` does, in its own process, not in the clients' GIL;
- the engine first prefills more than its KV cache holds (a CPU engine's first touch of
  each cache page is slow), and its prefix cache is emptied before every workload
  (vLLM's dev-mode `POST /reset_prefix_cache`), as each simulation starts cold.

With `--emulator` the engine is kvmigrate's own emulated vLLM in real time: not a fidelity
claim (its latency model is a formula much like the cost model's), a consistency check
that the simulator and the emulator agree on the same workload.

Targets (issue 22): A within 20% on TTFT p50 per turn and 5 points on the hit rate after
calibrating on it; B within 25% with the same calibration. About 2.5 minutes on the 2-core
test machine.

On any exit (an error, Ctrl-C, SIGTERM or SIGHUP) it stops the engine it started: vLLM's
whole process group, SIGKILL after a grace period (tests/bench/test_vllm_cleanup.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from urllib.request import Request, urlopen

from soak import count_rows, proxy_process

from kvmigrate.bench import RunSettings, Target, TurnRecord, run_bench, synthetic
from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.emulator.settings import latency_for
from kvmigrate.plan.calibrate import fit_probe, probe_endpoint
from kvmigrate.plan.cost_model import CostModel
from kvmigrate.plan.metrics import figures
from kvmigrate.plan.refine import refine
from kvmigrate.plan.scheduler import EngineSettings
from kvmigrate.plan.simulate import Fleet, simulate
from kvmigrate.plan.workload import Workload, from_store
from kvmigrate.recorder import open_store
from kvmigrate.serving import BackgroundServer, free_port
from kvmigrate.testbed.tiny_model import ensure_tiny_model
from kvmigrate.testbed.unwind import exit_on_signals
from kvmigrate.testbed.vllm_server import VllmServer
from kvmigrate.testbed.vllm_venv import ensure_vllm_venv

BLOCK, BUDGET = 32, 2048
KV_TOKENS = 256 * 2**20 // (2 * 4 * 4 * 64 * 2)  # --kv-cache-memory-bytes 256M, bench shape
CONFIG = """
backends:
  hosted: {{api_base: "{url}"}}
  vllm: {{api_base: "{url}"}}
models:
  - {{model_name: bench, hosted: bench, vllm: bench}}
rollout: {{mode: shadow, shadow_sample: 0, noise_sample: 0}}
record: {{db: "sqlite:///{db}", content: none}}
"""


@dataclass(frozen=True)
class Shape:
    name: str
    conversations: int
    turns: int
    concurrency: int
    system_words: int = 250
    turn_words: int = 100
    max_tokens: int = 16
    seed: int = 1


# Enough conversations that each turn's p50 is steady: a turn's TTFTs fall into two groups
# (the prompt prefilled alone, or beside another's), and with 16 samples the median lands
# anywhere in the gap between them.
A = Shape("A", conversations=48, turns=6, concurrency=2)
B = Shape("B", conversations=36, turns=4, concurrency=4, system_words=400, seed=2)


def record(base_url: str, shape: Shape, root: Path) -> list[TurnRecord]:
    """Run the shape through a recording proxy (records in `root`/NAME.db); the client's
    own records. The proxy runs as `kvmigrate proxy` does, in its own process: in this
    process's thread it would share the clients' GIL and add its waits to every TTFT."""
    db = root / f"{shape.name}.db"
    config = root / f"{shape.name}.yaml"
    config.write_text(CONFIG.format(url=base_url, db=db))
    conversations = synthetic(shape.conversations, shape.turns, shape.system_words,
                              shape.turn_words, seed=shape.seed)  # fmt: skip
    settings = RunSettings(concurrency=shape.concurrency, max_tokens=shape.max_tokens)
    port = free_port()
    with proxy_process(config, port, root / f"{shape.name}.proxy.log").start():
        target = Target(f"http://127.0.0.1:{port}/v1", "bench")
        run = asyncio.run(run_bench(target, conversations, settings))
    # Leaving the block stops the proxy with SIGTERM, which flushes its recorder.
    written = count_rows(db, "SELECT count(*) FROM records")
    if written != len(run.records):
        raise RuntimeError(f"{shape.name}: {written} records stored for {len(run.records)} turns")
    return run.records


def load(url: str) -> Workload:
    with open_store(url) as store:
        return from_store(store, 0.0, time.time() + 1)


def fleet(cost: CostModel) -> Fleet:
    return Fleet(KV_TOKENS // BLOCK, cost, EngineSettings(BUDGET, 256, BLOCK))


def compare(shape: Shape, workload: Workload, measured: list[TurnRecord], cost: CostModel) -> float:
    predicted = figures(simulate(workload, fleet(cost), 1))
    measured_p50 = _p50_by_turn(measured)
    prompt = sum(r.prompt_tokens or 0 for r in measured)
    hit = sum(r.cached_tokens or 0 for r in measured) / prompt
    print(f"\nworkload {shape.name} ({shape.conversations} conversations x {shape.turns} turns, "
          f"{shape.concurrency} at once), cost model {cost.source}:")  # fmt: skip
    print(f"{'turn':>4}  {'measured p50':>12}  {'predicted p50':>13}  {'error':>7}")
    errors = []
    for row in predicted.turns:
        real = measured_p50[int(row.turn.rstrip("+"))]
        error = (row.ttft_p50_s - real) / real
        errors.append(abs(error))
        ms = f"{real * 1e3:>9.1f} ms  {row.ttft_p50_s * 1e3:>10.1f} ms"
        print(f"{row.turn:>4}  {ms}  {error:>+7.1%}")
    print(f"prefix-cache hit rate: measured {hit:.1%}, predicted {predicted.hit_rate:.1%} "
          f"({(predicted.hit_rate - hit) * 100:+.1f} points)")  # fmt: skip
    print(f"TTFT p50 error by turn: mean {statistics.fmean(errors):.1%}, max {max(errors):.1%}")
    return max(errors)


def _p50_by_turn(records: list[TurnRecord]) -> dict[int, float]:
    by_turn: dict[int, list[float]] = defaultdict(list)
    for r in records:
        if r.ttft_s is not None:
            by_turn[r.turn].append(r.ttft_s)
    return {turn: statistics.median(values) for turn, values in by_turn.items()}


def noise_floor(first: list[TurnRecord], again: list[TurnRecord]) -> float:
    """How far a second run of the same workload on the same engine lands from the first:
    no prediction of a single run can be trusted to better than this."""
    one, two = _p50_by_turn(first), _p50_by_turn(again)
    print("\nworkload A run twice on the same engine (the measurement's own spread):")
    worst = 0.0
    for turn in sorted(one):
        error = (two[turn] - one[turn]) / one[turn]
        worst = max(worst, abs(error))
        print(f"{turn:>4}  {one[turn] * 1e3:>9.1f} ms  {two[turn] * 1e3:>10.1f} ms  {error:>+7.1%}")
    return worst


@dataclass
class Measurements:
    """What one engine run measured; everything the comparison needs."""

    engine: str
    probe: list[TurnRecord]
    batch_itls: list[float]
    runs: dict[str, list[TurnRecord]] = field(default_factory=dict)

    def save(self, directory: Path) -> None:
        payload = asdict(self)
        (directory / "measurements.json").write_text(json.dumps(payload, indent=1))

    @classmethod
    def load(cls, directory: Path) -> Measurements:
        raw = json.loads((directory / "measurements.json").read_text())
        runs = {name: _turns(rows) for name, rows in raw["runs"].items()}
        return cls(raw["engine"], _turns(raw["probe"]), raw["batch_itls"], runs)


def _turns(rows: list[dict[str, object]]) -> list[TurnRecord]:
    return [TurnRecord(**row) for row in rows]  # type: ignore[arg-type]


def pin(engine_cpus: int) -> tuple[str, str]:
    """Give the engine's compute its own cores and everything else (this process, its
    proxy and clients, vLLM's API server and scheduler) the rest, as a GPU has its own
    compute: on a small machine the clients' and the API server's work would otherwise
    slow the engine's steps, which no cost model of the engine can predict. vLLM binds its
    worker's threads (VLLM_CPU_OMP_THREADS_BIND) itself; its other processes inherit this
    process's affinity. The two CPU lists."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return "all", "all"
    engine_cpus = max(1, min(engine_cpus, len(cpus) - 1))
    engine, host = cpus[:engine_cpus], cpus[engine_cpus:]
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, engine))
    os.sched_setaffinity(0, host)
    return ",".join(map(str, engine)), ",".join(map(str, host))


@dataclass(frozen=True)
class Engine:
    base_url: str
    description: str

    def reset(self) -> None:
        """Empty the engine's prefix cache (vLLM's dev-mode endpoint), so each workload
        starts cold, as the simulation of it does."""
        root = self.base_url.removesuffix("/v1")
        with urlopen(Request(f"{root}/reset_prefix_cache", method="POST"), timeout=30) as answer:
            body = answer.read()
        if json.loads(body).get("success") is not True:
            raise RuntimeError(f"the engine did not reset its prefix cache: {body!r}")


@contextmanager
def engine(emulated: bool, engine_cpus: int | None) -> Iterator[Engine]:
    """Real vLLM, or the emulator's vLLM profile in real time, stopped on any exit: the
    `with` blocks below stop it on an exception, and `exit_on_signals` (in `main`) turns
    SIGTERM, SIGHUP and SIGINT into one. VllmServer signals its whole process group (API
    server, engine core, worker), SIGKILL after a grace period."""
    if emulated:
        # One prefill at a time, as a vLLM step holds them (the profile's default runs four
        # side by side, each at full speed, which no step-based engine does).
        settings = EmulatorSettings(
            profile="vllm", models=("bench",), block_size=BLOCK, cache_capacity_tokens=KV_TOKENS,
            latency=latency_for("vllm", engine_concurrency=1),
        )  # fmt: skip
        with BackgroundServer(lambda: build_app(settings)) as emulator:
            yield Engine(emulator.url + "/v1", "the emulator's vllm profile")
        return
    python = ensure_vllm_venv()
    model = ensure_tiny_model("bench", python)
    where = "unpinned"
    if engine_cpus is not None:
        where = "engine on CPUs {}, the rest on {}".format(*pin(engine_cpus))
    os.environ["VLLM_SERVER_DEV_MODE"] = "1"  # POST /reset_prefix_cache
    # The worker in the engine's own process, its compute threads bound to the engine's
    # CPUs: with vLLM's default on the CPU, a worker process, the engine process would
    # busy-poll their shared-memory queue on the clients' CPUs.
    extra = (
        "--max-num-batched-tokens",
        str(BUDGET),
        "--max-num-seqs",
        "256",
        "--distributed-executor-backend",
        "uni",
    )
    with VllmServer(model, served_model_name="bench", python=python, extra_args=extra) as server:
        cpus = os.cpu_count()
        yield Engine(server.base_url, f"vLLM on {platform.node()} ({cpus} CPUs, {where})")


def warm_up(served: Engine) -> None:
    """Prefill more prompts than the KV cache holds, then empty it: a CPU engine's first
    pass over its cache pays the kernel for every page it touches, which would slow
    whichever workload ran first and no cost model would predict."""
    conversations = synthetic(2 * KV_TOKENS // 1200, 1, 1200, 8, seed=99)
    settings = RunSettings(concurrency=4, max_tokens=1)
    asyncio.run(run_bench(Target(served.base_url, "bench"), conversations, settings))
    served.reset()


def measure(emulated: bool, engine_cpus: int | None, root: Path) -> Measurements:
    """Warm the engine up, probe it, then record workloads A, B and A again through the
    proxy, each from a cold prefix cache."""
    with engine(emulated, engine_cpus) as served:
        warm_up(served)
        started = time.perf_counter()
        probe, itls = probe_endpoint(Target(served.base_url, "bench"), (128, 256, 512, 1024), 3)
        print(f"probed in {time.perf_counter() - started:.0f} s: {served.description}")
        measured = Measurements(served.description, probe, itls)
        for shape in (A, B, replace(A, name="A2")):
            served.reset()
            measured.runs[shape.name] = record(served.base_url, shape, root)
    measured.save(root)
    return measured


def as_recorded(measured: Measurements, root: Path) -> Measurements:
    """The workloads' turns with the TTFT the proxy recorded for each (the engine's, as a
    pilot's records hold it) in place of the clients' (which add the proxy's and the
    clients' own time on a host core they share)."""
    runs = {}
    for name, turns in measured.runs.items():
        with open_store(f"sqlite:///{root / name}.db") as store:
            rows = store.query("SELECT turn, ttft_ms FROM records WHERE role = 'serve'")
            runs[name] = [replace(turns[0], turn=int(t), ttft_s=ms / 1000) for t, ms in rows
                          if ms is not None]  # fmt: skip
    return Measurements(measured.engine, measured.probe, measured.batch_itls, runs)


def analyse(measured: Measurements, root: Path) -> None:
    probed = fit_probe(measured.probe, measured.batch_itls, measured.engine)
    print(f"engine: {measured.engine}\ncost model: "
          + ", ".join(f"{k}={v:.3g}" for k, v in probed.to_json().items()
                      if isinstance(v, float)))  # fmt: skip
    floor = noise_floor(measured.runs["A"], measured.runs["A2"])
    workloads = {name: load(f"sqlite:///{root / name}.db") for name in ("A", "B")}
    refined, rms = refine(workloads["A"], fleet(probed), 1, "probe, refined on A's records")
    print(f"refined on A's records: x{refined.request_s / (probed.request_s or 1):.2f} fixed, "
          f"x{refined.prefill_token_s / (probed.prefill_token_s or 1):.2f} per token, "
          f"RMS log error {rms:.2f}")  # fmt: skip
    worst: dict[tuple[str, str], float] = {}
    for cost in (probed, refined):
        for shape in (A, B):
            measured_turns = measured.runs[shape.name]
            worst[(cost.source, shape.name)] = compare(
                shape, workloads[shape.name], measured_turns, cost
            )
    print("\nworst per-turn TTFT p50 error (targets: A 20% after calibrating on it, B 25%):")
    print(f"  A run again on the same engine, against its first run (the noise floor): {floor:.1%}")
    for (source, name), value in worst.items():
        print(f"  {name} with the cost model {source}: {value:.1%}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--emulator", action="store_true", help="the emulator's vLLM profile")
    parser.add_argument("--engine-cpus", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                        help="CPUs for vLLM's compute; the rest run everything else")  # fmt: skip
    parser.add_argument("--no-pin", action="store_true", help="let every process use every CPU")
    parser.add_argument("--save", type=Path, help="keep the raw measurements in this directory")
    parser.add_argument("--from", dest="source", type=Path,
                        help="compare measurements kept by --save; starts no engine")  # fmt: skip
    parser.add_argument("--against", choices=("clients", "proxy"), default="clients",
                        help="with --from: the TTFTs to compare with")  # fmt: skip
    args = parser.parse_args()
    if args.source:
        measured = Measurements.load(args.source)
        if args.against == "proxy":
            measured = as_recorded(measured, args.source)
        analyse(measured, args.source)
        return 0
    root = args.save or Path(tempfile.mkdtemp(prefix="kvmigrate-fidelity-"))
    root.mkdir(parents=True, exist_ok=True)
    engine_cpus = None if args.no_pin else args.engine_cpus
    # A SIGTERM (a timeout, a CI runner) used to kill this process and leave vLLM running.
    with exit_on_signals():
        measured = measure(args.emulator, engine_cpus, root)
    analyse(measured, root)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
