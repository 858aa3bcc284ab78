"""The vLLM side of deploy/, against the vLLM the test bed installs (kvmigrate.testbed): the same
version as the pinned vllm/vllm-openai image, so its CLI parser and its metric names are the
ones the image has. Skipped where the test bed's vLLM venv is absent."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvmigrate.testbed.vllm_venv import VLLM_REQUIREMENT, is_ready, venv_python

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
needs_vllm_venv = pytest.mark.skipif(not is_ready(), reason="the test bed's vLLM venv is absent")


def _vllm_containers() -> list[tuple[str, dict[str, Any]]]:
    docs = yaml.safe_load_all((DEPLOY / "k8s" / "vllm.yaml").read_text(encoding="utf-8"))
    deployment = next(d for d in docs if d and d["kind"] == "Deployment")
    k8s = deployment["spec"]["template"]["spec"]["containers"][0]
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text(encoding="utf-8"))
    service = compose["services"]["vllm"]
    return [
        ("k8s", {"image": k8s["image"], "argv": [*k8s["command"], *k8s["args"]]}),
        (
            "compose",
            {"image": service["image"], "argv": [*service["entrypoint"], *service["command"]]},
        ),
    ]


def _vllm_source() -> Path:
    python = venv_python()
    out = subprocess.run(
        [str(python), "-c", "import importlib.util as u; print(u.find_spec('vllm').origin)"],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout.strip()  # fmt: skip
    return Path(out).parent


@pytest.mark.parametrize(
    ("where", "container"), _vllm_containers(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_image_version_is_the_tested_vllm_version(where: str, container: dict[str, Any]) -> None:
    version = VLLM_REQUIREMENT.split("==")[1]
    assert container["image"] == f"vllm/vllm-openai:v{version}", (
        f"{where}: the image should be the vLLM version the test bed checks the flags and "
        f"metric names against ({VLLM_REQUIREMENT}); bump both together"
    )


@needs_vllm_venv
def test_dashboard_vllm_metrics_exist_in_vllm() -> None:
    dashboard = json.loads(
        (DEPLOY / "grafana" / "kvmigrate-dashboard.json").read_text(encoding="utf-8")
    )
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p.get("targets", []))
    used = {
        re.sub(r"_(total|bucket|sum|count)$", "", n) for n in re.findall(r"vllm:[a-z_]+", exprs)
    }
    assert used
    source = " ".join(
        p.read_text(encoding="utf-8") for p in (_vllm_source() / "v1" / "metrics").glob("*.py")
    )
    for name in used:
        assert f'"{name}"' in source, f"vLLM {VLLM_REQUIREMENT} defines no metric {name}"


_PARSE = r"""
import json, sys
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.tool_parsers import ToolParserManager
out = []
for argv in json.loads(sys.argv[1]):
    assert argv[:2] == ["vllm", "serve"], argv
    parser = FlexibleArgumentParser()
    command = ServeSubcommand()
    command.subparser_init(parser.add_subparsers())
    args = parser.parse_args(argv[1:])
    command.validate(args)
    ToolParserManager.get_tool_parser(args.tool_call_parser)
    out.append({k: getattr(args, k, None) for k in (
        "model_tag", "enable_prefix_caching", "enable_prompt_tokens_details",
        "enable_auto_tool_choice", "tool_call_parser", "max_model_len",
        "gpu_memory_utilization", "port")})
print(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.vllm
@needs_vllm_venv
def test_vllm_accepts_the_serve_arguments() -> None:
    """vLLM's own `vllm serve` parser and its pre-start checks accept both command lines."""
    containers = _vllm_containers()
    result = subprocess.run(
        [str(venv_python()), "-c", _PARSE, json.dumps([c["argv"] for _, c in containers])],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    parsed = json.loads(result.stdout.strip().splitlines()[-1])
    for (where, container), args in zip(containers, parsed, strict=True):
        assert args["model_tag"] == container["argv"][2], where
        assert args["enable_prefix_caching"] is True, where
        assert args["enable_prompt_tokens_details"] is True, where
        assert args["enable_auto_tool_choice"] is True, where
        assert args["tool_call_parser"] == "llama3_json", where
        assert args["max_model_len"], where
        assert 0 < args["gpu_memory_utilization"] <= 1, where
        assert args["port"] == 8000, where
