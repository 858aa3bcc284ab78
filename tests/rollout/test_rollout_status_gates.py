"""`rollout status` lists every gate, on or off: a gate the config leaves off is a line
saying so, not a missing line (a candidate parity failed was promoted to 100% with
`min_parity` commented out, and status never mentioned parity)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvmigrate.cli import main

CONFIG = """
backends:
  hosted: {{api_base: "http://127.0.0.1:9/v1"}}
  vllm: {{api_base: "http://127.0.0.1:9/v1"}}
models:
  - {{model_name: m, hosted: m, vllm: m}}
rollout:
  state: "sqlite:///{root}/state.db"
  gates: {{{gates}}}
record: {{db: "sqlite:///{root}/records.db"}}
"""


def _status(tmp_path: Path, gates: str) -> list[str]:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG.format(root=tmp_path, gates=gates))
    result = CliRunner().invoke(main, ["rollout", "status", "--config", str(path)])
    assert result.exit_code == 0, result.output
    return [line.split()[:2] for line in result.output.splitlines() if line.startswith("  ")]


def test_a_gate_left_off_is_listed_as_off(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG.format(root=tmp_path, gates="min_requests: 100"))
    result = CliRunner().invoke(main, ["rollout", "status", "--config", str(path)])
    assert result.exit_code == 0, result.output
    assert "  OFF   parity      off (rollout.gates.min_parity not set)" in result.output


@pytest.mark.parametrize(
    ("gates", "parity"),
    [("min_parity: 0.9", ["WAIT", "parity"]), ("min_requests: 100", ["OFF", "parity"])],
)
def test_every_gate_has_a_line(tmp_path: Path, gates: str, parity: list[str]) -> None:
    assert _status(tmp_path, gates) == [
        ["WAIT", "traffic"],
        ["WAIT", "error_rate"],
        ["WAIT", "ttft_p95"],
        parity,
        ["OFF", "decode_speed"],
    ]


@pytest.mark.parametrize(
    ("gates", "off"),
    [
        ("min_parity: 0.9", {"decode_speed": "tps_p50_min"}),
        ("min_requests: 100", {"parity": "min_parity", "decode_speed": "tps_p50_min"}),
        ("min_parity: 0.9, tps_p50_min: 50", {}),
    ],
)
def test_the_json_status_names_the_gates_left_off(
    tmp_path: Path, gates: str, off: dict[str, str]
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG.format(root=tmp_path, gates=gates))
    result = CliRunner().invoke(main, ["rollout", "status", "--json", "--config", str(path)])
    assert result.exit_code == 0, result.output
    status = json.loads(result.output)
    assert status["gates_off"] == off
    assert [g["name"] for g in status["gates_for_next_step"]] == [
        "traffic",
        "error_rate",
        "ttft_p95",
        *(["parity"] if "parity" not in off else []),
        *(["decode_speed"] if "decode_speed" not in off else []),
    ]
