"""`kvmigrate demo --api anthropic`: agents on the anthropic SDK, through the proxy, against
the emulated Anthropic API with the emulated vLLM's /v1/messages in shadow."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_anthropic_agents_shadow_with_cache_hits_by_turn_on_both_sides(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvmigrate",
            "demo",
            "--api",
            "anthropic",
            "--conversations",
            "8",
            "--turns",
            "3",
            "--time-scale",
            "0.2",
            "--out",
            str(tmp_path / "report.html"),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    out = proc.stdout
    assert "TTFT by turn" in out
    lines = out.split("Prefix cache hit by turn", 1)[1].splitlines()
    rows = {line.split()[0]: line.split()[1:] for line in lines[4:7]}
    assert rows["1"][0] == "0.0%"  # the primary caches only at breakpoints, none written yet
    # Turn 2 resends turn 1 behind the moved breakpoint: both sides read their caches.
    assert all(float(share.rstrip("%")) > 50 for share in rows["2"]), rows
    assert "header                 24" in out  # every call keyed by its X-Session-ID
    assert (tmp_path / "report.html").exists()
