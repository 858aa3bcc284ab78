"""The demo's second model: it moves on its own rollout, at its own pace.

Its agents are fewer than the first model's, so its gates, which judge it on its own
traffic only, pass later: while the first model walks 10 -> 50 -> 100%, this one waits for
evidence, then takes its first step when its own records allow it.
"""

from __future__ import annotations

from collections.abc import Callable

from kvmigrate.policies.gates import Verdict
from kvmigrate.rollout.controller import GatesRefused, RolloutController
from kvmigrate.rollout.status_table import render_status_table

SECOND_MODEL = "gpt-4o"
# Model calls per conversation: past turn 10, where the playbook reads "turn-N latency flat".
SECOND_MODEL_TURNS = 12

Echo = Callable[[str], None]


def follow(controller: RolloutController, echo: Echo) -> None:
    """Promote the second model to its next step if its own gates allow; say why not."""
    status = controller.status(SECOND_MODEL)
    step = status.next_step
    if step is None:
        return
    try:
        controller.set_percent(step, reason="demo", actor="demo", cohort=SECOND_MODEL)
    except GatesRefused as refused:
        held = next(g for g in refused.results if g.verdict != Verdict.PASSED)
        echo(
            f"{SECOND_MODEL} stays at {_percent(status.state.percent)}: its own gates say "
            f"{held.verdict} ({held.name}: {held.detail.split(';')[0]})"
        )
        return
    echo(f"{SECOND_MODEL} moves to {step:g}% on its own evidence")


def show_cohorts(controller: RolloutController, echo: Echo) -> None:
    echo("\nEach model on its own rollout (kvmigrate rollout status):")
    echo(render_status_table(controller.statuses()))


def _percent(value: float) -> str:
    return f"{value:g}%"
