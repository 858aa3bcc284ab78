"""Emulated OpenAI-compatible backends: a hosted-API profile and a vLLM profile with prefix
caching, a latency model and fault injection, for the demo, the tests and the benchmarks."""

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
