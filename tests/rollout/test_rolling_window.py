"""The auto-rollback's live window of one backend: evidence is only what ran under the
state being judged."""

from __future__ import annotations

import time

from kvmigrate.rollout.watcher import RollingWindow


def test_a_call_started_before_the_state_changed_is_not_evidence_after_it() -> None:
    window = RollingWindow("vllm")
    before = time.perf_counter()
    window.add(before, failed=True, ttft=None)
    window.add_tools(before, 3, 3)
    window.clear()  # a rollback: the old state's evidence goes
    # The request sent before the rollback fails after it: no evidence against the new state.
    window.add(before, failed=True, ttft=None)
    window.add_tools(before, 2, 2)
    after = time.perf_counter()
    window.add(after, failed=False, ttft=0.1)
    window.add_tools(after, 1, 0)
    summary = window.summary(since=before)
    assert (summary.requests, summary.errors) == (1, 0)
    assert (summary.tool_calls, summary.invalid_tool_calls) == (1, 0)
