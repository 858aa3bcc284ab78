"""What the demo's gates are, set against config.yaml's, and why they differ.

The demo sends a few dozen conversations; the reference gates (config.yaml) are sized for
production traffic and would wait on the demo for far longer than it runs (a 1-point error
margin needs a few hundred conversations to decide with no errors on either side). So the
demo loosens them, and says so before its first figure rather than leaving a reader to
assume that its promotions passed the gates a real rollout uses.
"""

from __future__ import annotations

from dataclasses import fields

from kvmigrate.config import Config, parse_config
from kvmigrate.config.init import example_text
from kvmigrate.policies.gate_model import GateConfig

WHY = (
    "why: the demo sends a few dozen conversations, and config.yaml's gates would wait for "
    "hundreds (a 1-point error margin needs about 240 with no errors either side); a real "
    "rollout keeps config.yaml's"
)


def reference_gates() -> GateConfig:
    """The gates of the example config.yaml (`kvmigrate init` writes the same ones)."""
    return parse_config(example_text(), "config.yaml", env={}, secrets_required=False).rollout.gates


def threshold_lines(config: Config) -> list[str]:
    """Each gate threshold the demo sets otherwise than config.yaml, both values, and why."""
    demo, reference = config.rollout.gates, reference_gates()
    changed = [
        f"{f.name} {_shown(getattr(demo, f.name))} (config.yaml: "
        f"{_shown(getattr(reference, f.name))})"
        for f in fields(GateConfig)
        if getattr(demo, f.name) != getattr(reference, f.name)
    ]
    if not changed:
        return ["gates: config.yaml's"]
    return ["gates looser than config.yaml's: " + ", ".join(changed), WHY]


def _shown(value: object) -> str:
    return "off" if value is None else f"{value:g}" if isinstance(value, float) else str(value)
