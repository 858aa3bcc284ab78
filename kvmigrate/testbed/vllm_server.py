"""A real vLLM OpenAI-compatible server (CPU build) run as a child process.

>>> with VllmServer(ensure_tiny_model()) as server:
...     openai.OpenAI(base_url=server.base_url, api_key="x").models.list()

The flags follow shared/notes/vllm-cpu.md. Things that matter for cleanup:
- vLLM runs as three processes (API server, engine core, worker). The server gets its own
  process group so one signal reaches all of them, and a SIGKILL follows after a grace
  period for anything that ignores SIGTERM.
- vLLM leaves a `vllm_dist_*` rendezvous file (plus IPC sockets) in the temp dir on every
  start. The child gets a private TMPDIR that is removed on stop, so exactly its own files
  go and another server's are never touched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

from kvmigrate.serving import free_port
from kvmigrate.testbed.vllm_venv import venv_python

# Tool calls on the tiny model: with these, `tools` + `tool_choice: auto` is accepted and
# the hermes parser extracts `<tool_call>` blocks the ChatML template asks for.
TOOL_ARGS = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
HOST = "127.0.0.1"


class VllmStartError(RuntimeError):
    """The server exited or did not become healthy; the message carries its log tail."""


class VllmServer:
    """Start vLLM on a free loopback port; `with` waits for /health and stops it after."""

    def __init__(
        self,
        model_dir: Path,
        *,
        served_model_name: str = "tiny",
        port: int | None = None,
        prefix_caching: bool = True,
        tool_calling: bool = True,
        extra_args: Sequence[str] = (),
        python: Path | None = None,
        log_path: Path | None = None,
        startup_timeout: float = 180.0,
        stop_grace: float = 10.0,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.served_model_name = served_model_name
        self.port = port or free_port(HOST)
        self.prefix_caching = prefix_caching
        self.tool_calling = tool_calling
        self.extra_args = tuple(extra_args)
        self.python = python or venv_python()
        self.log_path = log_path
        self.startup_timeout = startup_timeout
        self.stop_grace = stop_grace
        self.startup_seconds: float | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._tmpdir: Path | None = None
        self._saved_tail = ""

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}/v1"

    @property
    def root_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def command(self) -> list[str]:
        args = [
            str(self.python),
            "-m",
            # The `vllm` console script fails for the `vllm-cpu` distribution; the module works.
            "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir),
            "--served-model-name", self.served_model_name,
            "--host", HOST,
            "--port", str(self.port),
            "--load-format", "dummy",  # random weights: the model directory has none
            "--dtype", "bfloat16",
            "--max-model-len", "2048",
            "--enforce-eager",  # no graph compilation: starts faster
            "--enable-prompt-tokens-details",  # usage.prompt_tokens_details.cached_tokens
            "--kv-cache-memory-bytes", "256M",
            "--block-size", "32",  # the CPU backend needs a multiple of 32
            "--enable-prefix-caching" if self.prefix_caching else "--no-enable-prefix-caching",
        ]  # fmt: skip
        if self.tool_calling:
            args.extend(TOOL_ARGS)
        args.extend(self.extra_args)
        return args

    def start(self) -> VllmServer:
        if self._process is not None:
            raise RuntimeError("server already started")
        self._tmpdir = Path(tempfile.mkdtemp(prefix="kvm-vllm-"))
        log_path = self.log_path or self._tmpdir / "vllm.log"
        self.log_path = log_path
        env = dict(os.environ, TMPDIR=str(self._tmpdir), HF_HUB_OFFLINE="1")
        env.update(VLLM_NO_USAGE_STATS="1", TRANSFORMERS_OFFLINE="1")
        # Responses API chains (previous_response_id) need vLLM's response store.
        env.update(VLLM_ENABLE_RESPONSES_API_STORE="1")
        self._log = log_path.open("ab")
        started = time.monotonic()
        self._process = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=self._tmpdir,
            start_new_session=True,  # its own process group, so stop() reaches the workers
        )
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            assert self._process is not None
            code = self._process.poll()
            if code is not None:
                raise VllmStartError(f"vLLM exited with {code} while starting:\n{self.log_tail()}")
            if self._healthy():
                return
            time.sleep(0.25)
        raise VllmStartError(
            f"vLLM not healthy after {self.startup_timeout:.0f}s:\n{self.log_tail()}"
        )

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.root_url + "/health", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL it after the grace period, remove temp files."""
        process, self._process = self._process, None
        if process is not None:
            _terminate_group(process, self.stop_grace)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._tmpdir is not None:
            if self.log_path is not None and self.log_path.is_relative_to(self._tmpdir):
                self._keep_log()
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def _keep_log(self) -> None:
        """The default log sits in the temp dir; keep its tail in memory for later errors."""
        assert self.log_path is not None
        self._saved_tail = self.log_tail()
        self.log_path = None

    def log_tail(self, size: int = 6000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return self._saved_tail
        with self.log_path.open("rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - size))
            return handle.read().decode(errors="replace")

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _terminate_group(process: subprocess.Popen[bytes], grace: float) -> None:
    pgid = process.pid  # start_new_session made the child its group's leader
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace)
    # The parent may exit before its engine/worker children do; give them the same grace.
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    _signal_group(pgid, signal.SIGKILL)
    process.wait()


def _signal_group(pgid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True
