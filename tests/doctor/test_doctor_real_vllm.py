"""`kvmigrate doctor` against the real vLLM test bed, which runs with prefix caching,
prompt-token details and the hermes tool parser: every required check must pass."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kvmigrate.cli import main
from kvmigrate.testbed.vllm_server import VllmServer

pytestmark = pytest.mark.vllm


@pytest.mark.slow
def test_the_test_bed_vllm_passes_the_required_checks(real_vllm: VllmServer) -> None:
    result = CliRunner().invoke(main, ["doctor", "--base-url", real_vllm.base_url, "--json"])
    report = json.loads(result.stdout)
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert result.exit_code == 0, result.output
    assert report["model"] == "tiny"
    for name in ("reachable", "chat template", "prompt-token details", "prefix caching",
                 "tool calling", "responses chains"):  # fmt: skip
        assert statuses[name] == "pass", (name, report)
    prefix = next(c for c in report["checks"] if c["name"] == "prefix caching")
    # both sources of evidence: usage and the Prometheus counter
    assert "cached of" in prefix["detail"]
    assert "vllm:prefix_cache_hits_total" in prefix["detail"]
    # optional: a warning when ./config.yaml names a hosted model with a longer context
    assert statuses["max model len"] in {"pass", "warn"}
