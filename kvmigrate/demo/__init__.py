"""`kvmigrate demo`: shadow, report, gated rollout and auto-rollback on emulated backends."""

from kvmigrate.demo.run import DemoSettings, run_demo

__all__ = ["DemoSettings", "run_demo"]
