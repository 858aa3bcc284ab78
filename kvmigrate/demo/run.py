"""`kvmigrate demo`: the whole migration in under a minute, on emulated backends.

1. Shadow: agents talk to the emulated hosted API through the proxy; every request is
   shadowed to the emulated vLLM (prefix caching on), and a share is asked twice of the
   primary to measure its own noise. The shadow report follows.
2. Rollout: 10% -> 50% -> 100%, each step checked by the gates over recorded traffic.
   With a bad candidate (broken tool calls) the parity gate refuses; an operator override
   then shows auto-rollback pulling the candidate out by itself. A second model, with
   fewer agents, moves on its own rollout at its own pace (demo/second_model.py).
3. The HTML report, with the rollout timeline.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvmigrate.config import Config
from kvmigrate.demo import agent, anthropic_agent
from kvmigrate.demo.second_model import SECOND_MODEL, SECOND_MODEL_TURNS, follow, show_cohorts
from kvmigrate.demo.settle import wait_settled
from kvmigrate.demo.thresholds import threshold_lines
from kvmigrate.embedded import (
    CLAUDE_MODEL,
    HOSTED_MODEL,
    EmulatedBackends,
    embedded_config,
    emulated_backends,
    emulated_gpu,
)
from kvmigrate.policies.gates import Verdict, render_gates
from kvmigrate.private_files import write_private
from kvmigrate.progress import progress
from kvmigrate.recorder.evidence import open_controller
from kvmigrate.recorder.store import open_store as open_records
from kvmigrate.report import RENDERERS, Report
from kvmigrate.report.configured import configured_report
from kvmigrate.report.render_scorecard import SCORECARD_RENDERERS
from kvmigrate.rollout.controller import ChangeOutcome, GatesRefused, RolloutController
from kvmigrate.runtime import build_app
from kvmigrate.serving import BackgroundServer

Echo = Callable[[str], None]
# Gates sized for a demo's few dozen conversations; config.yaml's are stricter, and the demo
# prints both (demo/thresholds.py). Its few hundred requests can show a 10-point error
# margin, not config.yaml's 1 point.
MORE = (SECOND_MODEL,)
DEMO_ROLLOUT: dict[str, Any] = {
    "noise_sample": 1.0,
    "noise_per_minute": 100_000,
    "gates": {
        "min_conversations": 8,
        "min_requests": 30,
        "error_rate_margin": 0.1,
        "min_parity": 0.8,
        "min_parity_samples": 20,
    },
    "auto_rollback": {"window_seconds": 60, "min_requests": 10},
}


@dataclass(frozen=True)
class DemoSettings:
    """The defaults are the short story, under a minute on a quiet 2-core machine: a
    newcomer waits for it before anything else. Most of its time is the traffic the gates
    need (a few hundred requests a step; the CPU it takes is the floor), the rest the
    emulators' latencies, so it runs them at 0.15x, in a process of their own, and leaves a
    smaller bake after each step.
    FULL is the longer story at real latencies (`--full`, about two minutes and a half)."""

    conversations: int = 18
    turns: int = 4
    concurrency: int = 8
    time_scale: float = 0.15
    bad_candidate: bool = False
    real_vllm: bool = False
    out: Path | None = None  # None: report.html in a new temporary directory, kept
    workdir: Path | None = None
    api: str = "openai"  # or "anthropic": the agents speak Anthropic's Messages API
    # The traffic after each promotion, in multiples of what the next step's gates need at
    # the least; the gates ask for the rest they need before promoting anyway.
    bake_factor: int = 1


# `kvmigrate demo --full`: two dozen conversations of six turns at real latencies, and
# twice the gates' least traffic after each step.
FULL = {"conversations": 24, "turns": 6, "time_scale": 1.0, "bake_factor": 2}


def run_demo(settings: DemoSettings, echo: Echo) -> bool:
    """Run the demo; True when the rollout went as it should (complete, or the bad
    candidate refused and rolled back)."""
    with ExitStack() as stack:
        workdir = settings.workdir or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="kvmigrate-demo-"))
        )
        config = stack.enter_context(_backends_and_config(settings, workdir, echo))
        proxy = stack.enter_context(BackgroundServer(lambda: build_app(config, poll_interval=0.1)))
        controller = open_controller(config)
        stack.callback(controller.store.close)
        base_url = proxy.url if settings.api == "anthropic" else proxy.url + "/v1"
        started = time.time()
        where = (
            f"state and records in {workdir}"
            if settings.workdir is not None
            else "state and records in a temporary directory, deleted at the end "
            "(--keep keeps them)"
        )
        echo(f"proxy on {base_url} (shadow mode); {where}")
        echo("\n".join(threshold_lines(config)) + "\n")
        _phase(
            f"1. Shadow: {settings.conversations} agent conversations of {settings.turns} "
            "turns, shadowed to the candidate",
            echo,
        )
        _traffic(base_url, settings, [Agents(settings.conversations, 0)], echo)
        echo(_report(config, "text", started))
        _phase("2. Rollout 10% -> 50% -> 100%, checked by the gates", echo)
        ok = _walk(controller, base_url, settings, echo)
        _phase("3. Report", echo)
        # The playbook's checklist over the whole run, the figures a rollout is judged by.
        echo(_report(config, "text", started, SCORECARD_RENDERERS))
        out = settings.out or _new_report_path(settings.workdir)
        write_private(out, _report(config, "html", started))
        echo(f"wrote {out.resolve()}")
        return ok


@contextmanager
def _backends_and_config(settings: DemoSettings, workdir: Path, echo: Echo) -> Iterator[Config]:
    broken = 1.0 if settings.bad_candidate else 0.0
    api = settings.api
    with emulated_backends(
        settings.time_scale, broken_tool_calls=broken, api=api, own_process=True
    ) as emulated:
        if not settings.real_vllm:
            yield embedded_config(
                emulated,
                state_dir=str(workdir),
                rollout=DEMO_ROLLOUT,
                api=api,
                more_models=MORE,
                gpu=emulated_gpu(emulated),
            )
            return
        from kvmigrate.testbed.tiny_model import ensure_tiny_model
        from kvmigrate.testbed.vllm_server import VllmServer
        from kvmigrate.testbed.vllm_venv import ensure_vllm_venv

        echo("starting a real vLLM (CPU build, tiny model; about 30 s) ...")
        python = ensure_vllm_venv(log=echo)
        with VllmServer(
            ensure_tiny_model("tiny", python), served_model_name="tiny", python=python
        ) as vllm:
            backends = EmulatedBackends(emulated.hosted_url, vllm.base_url)
            yield embedded_config(
                backends,
                state_dir=str(workdir),
                candidate_model="tiny",
                rollout=DEMO_ROLLOUT,
                api=api,
                more_models=MORE,
                gpu={"scrape": True, "interval_seconds": 1.0, "device": "cpu"},
            )


@dataclass(frozen=True)
class Agents:
    """A group of agent conversations: `count` of them, numbered from `first` (each number
    is one conversation's identity), on `model` (None: the demo's chat model) for `turns`
    (None: the settings')."""

    count: int
    first: int
    model: str | None = None
    turns: int | None = None


def _traffic(base_url: str, settings: DemoSettings, groups: Sequence[Agents], echo: Echo) -> None:
    """Drive the groups at once, each `settings.concurrency` at a time: the second model's
    long conversations run beside the first's, not after them."""
    anthropic = settings.api == "anthropic"
    drive = anthropic_agent.drive if anthropic else agent.drive
    total = sum(group.count for group in groups)
    others = [f"{g.count} on {g.model}" for g in groups if g.model is not None]
    label = "  conversations" + (f" ({', '.join(others)})" if others else "")

    async def together(update: Callable[[int], None]) -> int:
        runs = [
            drive(
                base_url,
                group.model or _chat(settings),
                group.count,
                group.turns or settings.turns,
                settings.concurrency,
                update,
                group.first,
            )
            for group in groups
        ]
        return sum(await asyncio.gather(*runs))

    with progress(total, label) as bar:
        failed = asyncio.run(together(bar.update))
    if failed:
        echo(f"  {failed} calls failed (as the client saw them)")
    # The shadow copies finish and the recorder writes them: the report and the gates read
    # the records, and on a busy machine the recorder (lowest priority) is seconds behind.
    if not wait_settled(base_url.removesuffix("/v1")):
        echo("  the recorder is still writing; the figures below may lag")


def _walk(controller: RolloutController, base_url: str, settings: DemoSettings, echo: Echo) -> bool:
    # Enough traffic at each step for the next step's gates, with a margin.
    gates = controller.config.rollout.gates
    # At 50% half the conversations are served by the candidate and give no parity pairs:
    # the long story bakes twice the least; the short one leaves the rest to _promote,
    # which drives what the gates say they still need.
    least = max(gates.min_conversations, -(-gates.min_requests // settings.turns))
    bake = settings.bake_factor * least + 2
    for number, step in enumerate(controller.config.rollout.steps):
        try:
            outcome = _promote(controller, base_url, settings, step, echo)
        except GatesRefused as refused:
            echo(f"promotion to {step:g}% REFUSED by the gates:")
            echo(render_gates([g.to_dict() for g in refused.results]))
            return settings.bad_candidate and _show_auto_rollback(
                controller, base_url, settings, echo
            )
        echo(f"promoted to {step:g}% (version {outcome.state.version}):")
        echo(render_gates([g.to_dict() for g in outcome.gates]))
        # The second model's agents: a third as many, so its evidence comes later, and they
        # run long, past the turn the playbook's flatness row is read from.
        long = max(settings.turns, SECOND_MODEL_TURNS)
        first = 1000 * (number + 1)
        second = Agents(-(-bake // 3), first + 500, SECOND_MODEL, long)
        _traffic(base_url, settings, [Agents(bake, first), second], echo)
        follow(controller, echo)
    echo("rollout complete: the candidate serves every conversation")
    show_cohorts(controller, echo)
    return not settings.bad_candidate


def _promote(
    controller: RolloutController, base_url: str, settings: DemoSettings, step: float, echo: Echo
) -> ChangeOutcome:
    """Promote once the gates pass. While they wait, drive the conversations they say they
    still need (up to eight times the demo's size in all); a failed gate, or a wait past
    that, raises GatesRefused. Quiet, none is needed; on a busy machine TTFTs scatter and
    the TTFT gate's interval narrows slowly (three times the size ran out once, the gate
    still asking for more with the candidate at 0.40 x the primary)."""
    budget = 8 * settings.conversations
    while True:
        try:
            return controller.set_percent(step, reason="demo", actor="demo", cohort=_chat(settings))
        except GatesRefused as refused:
            waiting = [g for g in refused.results if g.verdict is Verdict.INCONCLUSIVE]
            needed = [g.needed_conversations or 0 for g in waiting]
            failed = any(g.verdict is Verdict.FAILED for g in refused.results)
            more = min(max(needed, default=0) + 2, budget)
            if failed or not waiting or budget <= 0:
                raise
            echo(f"gates before {step:g}% still waiting; {more} more conversations:")
            echo(render_gates([g.to_dict() for g in waiting]))
            first = 100_000 + 10_000 * int(step) + 8 * settings.conversations - budget
            _traffic(base_url, settings, [Agents(more, first)], echo)
            budget -= more


def _show_auto_rollback(
    controller: RolloutController, base_url: str, settings: DemoSettings, echo: Echo
) -> bool:
    echo("\nAn operator forces 10% anyway (recorded as an override) ...")
    chat = _chat(settings)
    controller.set_percent(
        10, reason="demo: override to show auto-rollback", actor="demo", force=True, cohort=chat
    )
    time.sleep(0.3)
    _traffic(base_url, settings, [Agents(settings.conversations, 5000)], echo)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and controller.read(chat).percent > 0:
        time.sleep(0.2)
    last = controller.history(1, chat)[-1]
    if last.action != "auto-rollback":
        echo("the candidate was NOT rolled back")
        return False
    echo(f"auto-rollback: {last.from_percent:g}% -> {last.to_percent:g}%: {last.reason}")
    return True


def _new_report_path(workdir: Path | None) -> Path:
    """Where the report goes unless --out says: beside the kept state, else in a directory
    of its own, never the current one (run in a clone, it left report.html in the tree)."""
    folder = workdir or Path(tempfile.mkdtemp(prefix="kvmigrate-demo-report-"))
    return folder / "report.html"


def _chat(settings: DemoSettings) -> str:
    """The cohort the demo's agents are: the chat model's (embeddings are hosted only)."""
    return CLAUDE_MODEL if settings.api == "anthropic" else HOSTED_MODEL


def _report(
    config: Config,
    fmt: str,
    since: float,
    renderers: Mapping[str, Callable[[Report], str]] = RENDERERS,
) -> str:
    with open_records(config.record.db) as store:
        now = time.time()
        report = configured_report(config, store, since, now + 1)
    return renderers[fmt](report)


def _phase(title: str, echo: Echo) -> None:
    echo(f"\n{title}\n{'=' * len(title)}")
