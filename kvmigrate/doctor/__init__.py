"""`kvmigrate doctor`: check that an engine is set up to deliver the prefix-cache win.

`checks` probes a live endpoint (through `endpoint`) and names the fix for each failure, each
check's outcome a `result.CheckResult`; `serve_command` writes a recommended `vllm serve`
line; `families` maps a model to its tool-call parser and `hosted_context` a hosted model to
its context window.
"""

from kvmigrate.doctor.checks import Diagnosis, Expectations, diagnose
from kvmigrate.doctor.endpoint import Endpoint
from kvmigrate.doctor.families import tool_flags, tool_parser
from kvmigrate.doctor.hosted_context import hosted_context
from kvmigrate.doctor.result import CheckResult
from kvmigrate.doctor.serve_command import ServeCommand, serve_command

__all__ = [
    "CheckResult",
    "Diagnosis",
    "Endpoint",
    "Expectations",
    "ServeCommand",
    "diagnose",
    "hosted_context",
    "serve_command",
    "tool_flags",
    "tool_parser",
]
