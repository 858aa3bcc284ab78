"""A real LiteLLM proxy process, for the plugin's tests and benchmark.

It runs from the separate LiteLLM venv (`litellm_venv`), offline: the remote model cost map
and Hugging Face tokenizer downloads that LiteLLM tries by default are switched off, since
on a machine without internet each costs seconds of retries (and a tokenizer download for a
streamed answer blocks LiteLLM's event loop while it times out).
"""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from kvmigrate.serving import free_port
from kvmigrate.testbed.litellm_venv import ensure_litellm_venv, proxy_env, venv_litellm

PLUGIN_CALLBACK = "kvmigrate.litellm_bridge.plugin.proxy_handler_instance"
# The path LiteLLM configs written before the plugin moved name; it still loads the same
# plugin (kvmigrate/integrations/litellm_plugin.py), and every git ref has it.
FIRST_PLUGIN_CALLBACK = "kvmigrate.integrations.litellm_plugin.proxy_handler_instance"
OFFLINE_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


def model_entry(group: str, model: str, api_base: str, api_key: str = "none") -> dict[str, Any]:
    """One `model_list` entry: an OpenAI-compatible deployment of `model` at `api_base`."""
    return {
        "model_name": group,
        "litellm_params": {"model": f"openai/{model}", "api_base": api_base, "api_key": api_key},
    }


def write_config(
    path: Path, model_list: list[dict[str, Any]], callbacks: list[str] | None = None
) -> Path:
    config: dict[str, Any] = {"model_list": model_list}
    if callbacks:
        config["litellm_settings"] = {"callbacks": callbacks}
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


class LiteLLMProxy:
    """`litellm --config CONFIG` on a free loopback port, until `stop()`.

    Subclasses run another server from the LiteLLM venv by overriding `command`, `label`
    and `ready_path`."""

    label = "LiteLLM"
    ready_path = "/health/readiness"

    def __init__(
        self,
        config_path: Path,
        kvmigrate_config: Path | None = None,
        master_key: str = "sk-kvmigrate-test",
        log_path: Path | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.config_path = config_path
        self.kvmigrate_config = kvmigrate_config
        self.master_key = master_key
        self.log_path = log_path or config_path.with_suffix(".log")
        self.extra_env = extra_env or {}
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 180.0) -> LiteLLMProxy:
        ensure_litellm_venv()
        self.port = free_port()
        env = proxy_env(self.kvmigrate_config or "", self.master_key)
        if self.kvmigrate_config is None:
            env.pop("KVMIGRATE_CONFIG", None)
        env.update(OFFLINE_ENV)
        env.update(self.extra_env)
        with self.log_path.open("wb") as log_file:
            self._process = subprocess.Popen(
                self.command(),
                env=env,
                cwd=self.config_path.parent,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._wait_ready(timeout)
        return self

    def command(self) -> list[str]:
        command = [str(venv_litellm()), "--config", str(self.config_path)]
        return [*command, "--host", "127.0.0.1", "--port", str(self.port), "--num_workers", "1"]

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                code = self._process.returncode
                raise RuntimeError(f"{self.label} exited ({code}):\n{self.log()}")
            if self._ready():
                return
            time.sleep(0.25)
        self.stop()
        raise TimeoutError(f"{self.label} not ready within {timeout:.0f}s:\n{self.log()}")

    def _ready(self) -> bool:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
        try:
            connection.request("GET", self.ready_path)
            return connection.getresponse().status == 200
        except OSError:
            return False
        finally:
            connection.close()

    def log(self, size: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-size:]
        except OSError:
            return ""

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM (LiteLLM shuts down and the plugin flushes its records), then SIGKILL."""
        process, self._process = self._process, None
        if process is None:
            return None
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(5)
        return process.returncode

    def __enter__(self) -> LiteLLMProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
