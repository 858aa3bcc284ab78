"""Emulated backends for a model with two candidates (issue 19): a hosted primary, `vllm`
and `vllm-fp8`, each a real emulator with its own response store."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.emulator.settings import FaultRates
from kvmigrate.serving import BackgroundServer


@contextmanager
def two_candidates(
    time_scale: float, fp8_faults: FaultRates | None = None
) -> Iterator[dict[str, BackgroundServer]]:
    """The three started, by backend name; `fp8_faults` breaks the second candidate."""
    settings = {
        "hosted": EmulatorSettings("hosted", time_scale=time_scale),
        "vllm": EmulatorSettings("vllm", time_scale=time_scale),
        "vllm-fp8": EmulatorSettings(
            "vllm", name="vllm-fp8", time_scale=time_scale, faults=fp8_faults or FaultRates()
        ),
    }
    servers = {n: BackgroundServer(lambda s=s: build_app(s)) for n, s in settings.items()}
    for server in servers.values():
        server.start()
    try:
        yield servers
    finally:
        for server in servers.values():
            server.stop()
