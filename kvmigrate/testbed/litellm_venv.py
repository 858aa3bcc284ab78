"""The separate venv that holds LiteLLM's proxy, for the plugin's tests and benchmark.

litellm never goes into the project's own venv: it pins dozens of companion packages, and
only the plugin's tests need a real LiteLLM proxy process. The recipe:

- `python -m venv` + `pip install litellm[proxy]==1.108.7` (never 1.107.0, which was
  compromised; later releases pin companion packages the registry does not serve);
- then kvmigrate's own runtime dependencies that litellm does not bring (computed from
  pyproject.toml, so a new dependency is picked up), installed with pip under the same lock.

kvmigrate itself is NOT installed there. The proxy process gets the repository root on
PYTHONPATH instead (`proxy_env`): the venv lives in ~/.cache and outlives any one checkout,
so an editable install would bind it to whichever checkout installed it first, and a test
run from another clone (CI runs in a fresh clone elsewhere) would silently load that stale
code. PYTHONPATH always points at the tree under test.

A marker file is written only once litellm imports, and a `flock` keeps parallel callers
from installing at the same time (the helper of the vLLM test bed).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from kvmigrate.testbed.locking import file_lock

VENV_ENV = "KVMIGRATE_LITELLM_VENV"
LITELLM_REQUIREMENT = "litellm[proxy]==1.108.7"
MARKER = ".kvmigrate-ready"
REPO_ROOT = Path(__file__).resolve().parents[2]

Log = Callable[[str], None]

# Run in the venv with the path of kvmigrate's pyproject.toml: print the requirements that
# no installed distribution satisfies, one per line.
_MISSING = """
import sys, tomllib
from importlib.metadata import PackageNotFoundError, version
from packaging.requirements import Requirement
with open(sys.argv[1], "rb") as f:
    deps = tomllib.load(f)["project"]["dependencies"]
for text in deps:
    req = Requirement(text)
    if req.marker is not None and not req.marker.evaluate():
        continue
    try:
        ok = req.specifier.contains(version(req.name), prereleases=True)
    except PackageNotFoundError:
        ok = False
    if not ok:
        print(text)
"""


def venv_dir() -> Path:
    override = os.environ.get(VENV_ENV)
    if override:
        return Path(override).expanduser()
    return Path.home() / ".cache" / "kvmigrate" / "litellm-1.108.7"


def venv_python(venv: Path | None = None) -> Path:
    return (venv or venv_dir()) / "bin" / "python"


def venv_litellm(venv: Path | None = None) -> Path:
    """The `litellm` proxy CLI of the venv."""
    return (venv or venv_dir()) / "bin" / "litellm"


def is_ready(venv: Path | None = None) -> bool:
    return ((venv or venv_dir()) / MARKER).exists()


def ensure_litellm_venv(venv: Path | None = None, log: Log | None = None) -> Path:
    """The venv's python, with litellm and kvmigrate's runtime dependencies installed."""
    venv = venv or venv_dir()
    say = log or _stderr
    if is_ready(venv) and not missing_dependencies(venv):
        return venv_python(venv)
    with file_lock(venv.with_name(venv.name + ".lock")):
        if not is_ready(venv):
            if venv_python(venv).exists() and _imports_litellm(venv):
                say(f"adopting the existing LiteLLM venv at {venv}")
            else:
                _install(venv, say)
            (venv / MARKER).write_text(f"{LITELLM_REQUIREMENT}\n")
        missing = missing_dependencies(venv)
        if missing:
            say(f"installing kvmigrate's dependencies into {venv}: {' '.join(missing)}")
            _run(venv, [str(venv_python(venv)), "-m", "pip", "install", *missing])
    return venv_python(venv)


def missing_dependencies(venv: Path | None = None) -> list[str]:
    """kvmigrate's declared runtime requirements that the venv does not satisfy."""
    result = subprocess.run(
        [str(venv_python(venv)), "-c", _MISSING, str(REPO_ROOT / "pyproject.toml")],
        capture_output=True,
        text=True,
        check=True,
    )
    return [line for line in result.stdout.splitlines() if line.strip()]


def proxy_env(
    config_path: str | os.PathLike[str],
    master_key: str,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of a LiteLLM proxy process that loads the kvmigrate plugin."""
    env = dict(os.environ if base is None else base)
    path = env.get("PYTHONPATH")
    env.update(
        PYTHONPATH=str(REPO_ROOT) + (os.pathsep + path if path else ""),
        KVMIGRATE_CONFIG=str(config_path),
        LITELLM_MASTER_KEY=master_key,
        LITELLM_TELEMETRY="False",
        DISABLE_SCHEMA_UPDATE="true",
        PYTHONUNBUFFERED="1",
    )
    return env


def _install(venv: Path, say: Log) -> None:
    log_path = venv.with_name(venv.name + ".install.log")
    say(f"installing {LITELLM_REQUIREMENT} into {venv} (~1 min); log: {log_path}")
    started = time.monotonic()
    shutil.rmtree(venv, ignore_errors=True)  # a half-written venv may hold broken packages
    venv.parent.mkdir(parents=True, exist_ok=True)
    _run(venv, [sys.executable, "-m", "venv", str(venv)])
    _run(venv, [str(venv_python(venv)), "-m", "pip", "install", LITELLM_REQUIREMENT])
    if not _imports_litellm(venv):
        raise RuntimeError(f"litellm does not import in {venv}; see {log_path}")
    say(f"LiteLLM venv ready in {time.monotonic() - started:.0f}s")


def _run(venv: Path, step: list[str]) -> None:
    log_path = venv.with_name(venv.name + ".install.log")
    with log_path.open("a") as log_file:
        log_file.write(f"$ {' '.join(step)}\n")
        log_file.flush()
        code = subprocess.run(step, stdout=log_file, stderr=subprocess.STDOUT).returncode
    if code != 0:
        tail = log_path.read_text(errors="replace")[-4000:]
        raise RuntimeError(f"`{' '.join(step)}` failed ({code}):\n{tail}")


def _imports_litellm(venv: Path) -> bool:
    check = [str(venv_python(venv)), "-c", "import litellm.proxy.proxy_server"]
    return subprocess.run(check, capture_output=True, check=False).returncode == 0


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
