"""deploy/docker-compose.yml: the compose-spec JSON schema (vendored by check-jsonschema, so it
works offline), then the links between services, files, the proxy config and the env file.
`docker compose config` runs too where a Docker CLI exists (not on the CI machine)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from kvmigrate.config import parse_config

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
COMPOSE_FILE = DEPLOY / "docker-compose.yml"
COMPOSE: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
SERVICES: dict[str, Any] = COMPOSE["services"]
ENV_EXAMPLE = DEPLOY / ".env.example"


def _env_example() -> dict[str, str]:
    env = {}
    for line in ENV_EXAMPLE.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip()
    return env


def _config_mount(service: dict[str, Any]) -> tuple[Path, str]:
    for volume in service["volumes"]:
        source, target = volume.split(":")[:2]
        if target == "/etc/kvmigrate/config.yaml":
            return (DEPLOY / source).resolve(), target
    raise AssertionError("the kvmigrate service mounts no /etc/kvmigrate/config.yaml")


def test_compose_file_matches_the_compose_spec_schema() -> None:
    text = (
        resources.files("check_jsonschema.builtin_schemas.vendor")
        .joinpath("compose-spec.json")
        .read_text(encoding="utf-8")
    )
    schema = json.loads(text)
    validator_cls = jsonschema.validators.validator_for(schema)
    validator_cls.check_schema(schema)
    errors = sorted(validator_cls(schema).iter_errors(COMPOSE), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors)


def _has_compose_v2() -> bool:
    if shutil.which("docker") is None:
        return False
    probe = subprocess.run(
        ["docker", "compose", "version"], capture_output=True, timeout=30, check=False
    )
    return probe.returncode == 0


@pytest.mark.skipif(not _has_compose_v2(), reason="no Docker Compose v2 CLI on this machine")
def test_docker_compose_config_accepts_the_file() -> None:
    env = {**_env_example(), "PATH": "/usr/bin:/bin:/usr/local/bin"}
    result = subprocess.run(
        ["docker", "compose", "-f", str(COMPOSE_FILE), "config", "--quiet"],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def test_services_depend_on_defined_services_and_all_have_healthchecks() -> None:
    assert set(SERVICES) == {"vllm", "kvmigrate", "redis"}
    for name, service in SERVICES.items():
        for dependency in service.get("depends_on", {}):
            assert dependency in SERVICES, f"{name} depends on unknown {dependency}"
        test = service["healthcheck"]["test"]
        assert test[0] in ("CMD", "CMD-SHELL"), name
    assert SERVICES["kvmigrate"]["depends_on"]["redis"]["condition"] == "service_healthy"


def test_images_are_pinned_and_the_proxy_builds_from_the_repo_dockerfile() -> None:
    for name, service in SERVICES.items():
        image = service["image"]
        _, sep, tag = image.rpartition(":")
        assert sep, f"{name}: {image} has no tag"
        assert tag != "latest", f"{name}: {image}"
        assert re.search(r"\d+\.\d+", tag), f"{name}: {image} is not a version tag"
    build = SERVICES["kvmigrate"]["build"]
    context = (DEPLOY / build["context"]).resolve()
    assert context == REPO
    assert (context / build["dockerfile"]).is_file()


def test_vllm_reserves_a_gpu_and_serves_with_the_migration_flags() -> None:
    vllm = SERVICES["vllm"]
    devices = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert any("gpu" in d["capabilities"] and d.get("driver") == "nvidia" for d in devices)
    assert vllm["image"].startswith("vllm/vllm-openai:v")
    args = vllm["command"]
    for flag in ("--enable-prefix-caching", "--enable-prompt-tokens-details",
                 "--enable-auto-tool-choice", "--tool-call-parser=llama3_json"):  # fmt: skip
        assert flag in args
    assert vllm.get("ipc") == "host" or vllm.get("shm_size")


def test_mounted_files_exist_and_named_volumes_are_declared() -> None:
    declared = set(COMPOSE.get("volumes") or {})
    for name, service in SERVICES.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith((".", "/")):
                assert (DEPLOY / source).exists(), f"{name}: {source} does not exist"
            elif not source.startswith(("$", "~")):
                assert source in declared, f"{name}: volume {source} is not declared"


def test_proxy_config_loads_and_points_at_the_compose_services() -> None:
    path, _ = _config_mount(SERVICES["kvmigrate"])
    text = path.read_text(encoding="utf-8")
    env_names = set(re.findall(r"^\s*\w+:\s*os\.environ/(\w+)", text, re.M))
    service_env = SERVICES["kvmigrate"]["environment"]
    example = _env_example()
    for name in env_names:
        assert name in service_env, f"config reads os.environ/{name}; the service does not set it"
        assert name in example, f"{name} missing from deploy/.env.example"
    config = parse_config(text, str(path), {n: example[n] for n in env_names})
    vllm_url = config.backends["vllm"].api_bases[0]
    assert vllm_url.startswith("http://vllm:8000/")
    assert config.rollout.state.startswith("redis://redis:6379/")
    served = {m.served["vllm"] for m in config.models if "vllm" in m.served}
    assert SERVICES["vllm"]["command"][0] in served
    assert config.record.db.startswith("sqlite:////var/lib/kvmigrate/")
    data_mounts = [v for v in SERVICES["kvmigrate"]["volumes"] if v.endswith(":/var/lib/kvmigrate")]
    assert data_mounts, "records and state need the writable volume"


def test_every_required_variable_is_in_the_env_example() -> None:
    text = COMPOSE_FILE.read_text(encoding="utf-8")
    required = set(re.findall(r"\$\{(\w+):\?", text))
    optional = set(re.findall(r"\$\{(\w+):-", text))
    example = _env_example()
    assert required
    assert required <= set(example)
    assert optional <= set(example)
    assert (DEPLOY / ".gitignore").read_text(encoding="utf-8").count(".env") >= 1
