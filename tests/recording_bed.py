"""A records DB made by real traffic: two emulators, a recording proxy, an SDK client.

Report, plan and reading tests each drive their own conversations through it; the bed
starts the servers, writes the config, and waits until the recorder has written what the
test expects before the servers stop.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import openai

from kvmigrate.config import load_config
from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.proxy import build_proxy_app
from kvmigrate.recorder import build_recorder
from kvmigrate.serving import BackgroundServer


@contextlib.contextmanager
def recorded_config(
    config_template: str,
    drive: Callable[[openai.OpenAI], None],
    expected_records: int,
    time_scale: float = 0.02,
    prefix: str = "kvmigrate-records-",
    emulators: Mapping[str, EmulatorSettings] | None = None,
) -> Iterator[Path]:
    """The path of a config whose records DB holds what `drive` sent through the proxy.

    `config_template` is formatted with each emulator's URL by name (`hosted`, `vllm`
    unless `emulators` names others) and `db`.
    """
    root = Path(tempfile.mkdtemp(prefix=prefix))
    settings = emulators or {
        p: EmulatorSettings(profile=p, time_scale=time_scale) for p in ("hosted", "vllm")
    }
    servers = {n: BackgroundServer(lambda s=s: build_app(s)) for n, s in settings.items()}
    try:
        with contextlib.ExitStack() as running:
            urls = {name: running.enter_context(server).url for name, server in servers.items()}
            path = root / "config.yaml"
            db = root / "records.db"
            path.write_text(config_template.format(db=db, **urls))
            config = load_config(path)
            recorder = build_recorder(config)
            with BackgroundServer(lambda: build_proxy_app(config, addons=[recorder])) as proxy:
                with openai.OpenAI(
                    base_url=proxy.url + "/v1", api_key="sk-x", max_retries=0
                ) as client:
                    drive(client)
                deadline = time.monotonic() + 15
                while recorder.stats.written < expected_records and time.monotonic() < deadline:
                    time.sleep(0.05)
        yield path
    finally:
        shutil.rmtree(root, ignore_errors=True)
