"""Emulated OpenAI-compatible backends: a hosted-API profile and a vLLM profile with prefix
caching, a latency model and fault injection, for the demo, the tests and the benchmarks.

The names below load on first use: `report` and `cachecheck` import `emulator.tokens`
alone, and must not pay for the server's imports (kvmigrate.lazy.package_exports)."""

from typing import TYPE_CHECKING

from kvmigrate.lazy import package_exports

if TYPE_CHECKING:
    from kvmigrate.emulator.faults import FAULT_HEADER
    from kvmigrate.emulator.server import build_app, serve
    from kvmigrate.emulator.settings import (
        PROFILES,
        EmulatorSettings,
        FaultRates,
        LatencySettings,
        Profile,
        latency_for,
    )

_SETTINGS = "kvmigrate.emulator.settings"
__getattr__ = package_exports(
    __name__,
    {
        "FAULT_HEADER": "kvmigrate.emulator.faults",
        "build_app": "kvmigrate.emulator.server",
        "serve": "kvmigrate.emulator.server",
        "PROFILES": _SETTINGS,
        "EmulatorSettings": _SETTINGS,
        "FaultRates": _SETTINGS,
        "LatencySettings": _SETTINGS,
        "Profile": _SETTINGS,
        "latency_for": _SETTINGS,
    },
)

__all__ = [
    "FAULT_HEADER",
    "PROFILES",
    "EmulatorSettings",
    "FaultRates",
    "LatencySettings",
    "Profile",
    "build_app",
    "latency_for",
    "serve",
]
