"""An emulated DCGM exporter beside the emulated vLLM, so the GPU utilisation figures (the
report's GPU section, the scorecard's 70-80% row) have a source without a GPU.

Utilisation is what DCGM_FI_DEV_GPU_UTIL means on a real card, the share of the sampling
interval a kernel was running, here the share of wall time since the previous scrape during
which the emulated engine had a request running. It is exported as dcgm-exporter does: a
gauge in whole percent, one series per GPU, with its labels.
"""

from __future__ import annotations

import time

from aiohttp import web

from kvmigrate.emulator.latency import PrefillEngine

PATH = "/dcgm/metrics"
_SERIES = (
    'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-00000000-0000-0000-0000-000000000000",'
    'pci_bus_id="00000000:00:00.0",device="nvidia0",modelName="Emulated GPU",'
    'Hostname="kvmigrate-emulator"}'
)


class GpuClock:
    """The engine's busy share between two reads."""

    def __init__(self, engine: PrefillEngine) -> None:
        self._engine = engine
        self._last = (time.monotonic(), engine.busy_seconds())

    def utilisation_pct(self) -> int:
        now, busy = time.monotonic(), self._engine.busy_seconds()
        then, busy_then = self._last
        self._last = (now, busy)
        span = now - then
        return 0 if span <= 0 else round(min(1.0, (busy - busy_then) / span) * 100)


def exposition(utilisation_pct: int) -> bytes:
    return (
        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n"
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
        f"{_SERIES} {utilisation_pct}\n"
    ).encode()


GPU_CLOCK: web.AppKey[GpuClock] = web.AppKey("emulator_gpu_clock", GpuClock)


async def dcgm_metrics(request: web.Request) -> web.StreamResponse:
    body = exposition(request.app[GPU_CLOCK].utilisation_pct())
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})
