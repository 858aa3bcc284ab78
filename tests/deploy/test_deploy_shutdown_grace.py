"""The deploy files' shutdown and sizing against what `kvmigrate proxy` does on SIGTERM.

On SIGTERM the proxy drains streams for `--drain-seconds` (5 by default), and a pool's
parent then gives its workers `RECORDS_MARGIN_S` more to write their records before it kills
them. The orchestrator's own kill (Kubernetes' terminationGracePeriodSeconds, after the
preStop hook; Compose's stop_grace_period, 10 s by default) must come after both, and the
drain must be asked for, or the grace period the manifest gives streams is never used.
Without `--workers` a pool runs a process per core of the node (no CPU limit: no quota),
each a whole proxy, under one memory limit."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from kvmigrate.proxy.pool import RECORDS_MARGIN_S
from kvmigrate.serving import DRAIN_S

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def _seconds(duration: str | int) -> float:
    """A Compose duration (`60s`, `1m30s`) in seconds."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", str(duration))
    scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(float(value) * scale[unit] for value, unit in parts)


def _proxy_pod() -> tuple[dict[str, Any], dict[str, Any]]:
    docs = yaml.safe_load_all((DEPLOY / "k8s" / "proxy-deployment.yaml").read_text())
    deployment = next(d for d in docs if d and d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    return pod, next(c for c in pod["containers"] if c["name"] == "proxy")


def test_k8s_grace_period_covers_the_drain_and_the_records() -> None:
    pod, proxy = _proxy_pod()
    args = proxy["args"]
    assert _flag(args, "--drain-seconds") is not None, "streams get the 5 s default drain"
    drain = float(_flag(args, "--drain-seconds") or DRAIN_S)
    pre_stop = float(proxy["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pre_stop + drain + RECORDS_MARGIN_S <= pod["terminationGracePeriodSeconds"]


def test_k8s_proxy_runs_a_fixed_number_of_workers() -> None:
    _pod, proxy = _proxy_pod()
    cpu_limit = proxy["resources"].get("limits", {}).get("cpu")
    assert _flag(proxy["args"], "--workers") is not None or cpu_limit is not None


def test_compose_stop_grace_period_covers_the_drain_and_the_records() -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    proxy = compose["services"]["kvmigrate"]
    drain = float(_flag(proxy["command"], "--drain-seconds") or DRAIN_S)
    grace = _seconds(proxy.get("stop_grace_period", "10s"))  # Compose's default
    assert drain + RECORDS_MARGIN_S <= grace
