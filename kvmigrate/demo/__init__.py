"""`kvmigrate demo`: shadow, report, gated rollout and auto-rollback on emulated backends."""

from kvmigrate.demo.run import FULL, DemoSettings, run_demo

__all__ = ["FULL", "DemoSettings", "run_demo"]
