"""The forward table's upstream and proxies, started once per file."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from forward_bed import ANSWER_AS_ASKED, SHADOW, SPLIT, Proxy, Upstream, proxy_config, running

from kvmigrate.proxy import forward


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    scripted = Upstream()
    with scripted.server:
        yield scripted


@pytest.fixture(scope="module")
def split(upstream: Upstream) -> Iterator[Proxy]:
    with running(proxy_config(upstream, SPLIT, server=ANSWER_AS_ASKED)) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def shadow(upstream: Upstream) -> Iterator[Proxy]:
    """A copy's read timeout is the candidate's; the copy as a whole is cut at the longest
    backend's (the dispatcher's deadline), so a stalled copy meets its own first."""
    with running(proxy_config(upstream, SHADOW, vllm_timeout=1.0)) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def impatient(upstream: Upstream) -> Iterator[Proxy]:
    """A primary whose read timeout a row can wait out: the answers meant to arrive are
    written at once, so only the stalls a row scripts outlast it."""
    with running(proxy_config(upstream, SHADOW, hosted_timeout=0.4)) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def lonely(upstream: Upstream) -> Iterator[Proxy]:
    """A proxy only the rows whose client leaves use, each alone: its open connections
    say when it has seen that client go."""
    with running(proxy_config(upstream, SPLIT)) as proxy:
        yield proxy


@pytest.fixture
def patient(monkeypatch: pytest.MonkeyPatch) -> None:
    """A held `data: [DONE]` waits for the upstream's end however late it comes, so that a
    busy machine cannot release it first (the release has rows of its own)."""
    monkeypatch.setattr(forward, "END_GRACE_S", 60.0)


@pytest.fixture
def no_collector() -> Iterator[None]:
    """An answer nobody closed frees its connection when the cyclic collector finds it (a
    finalizer's safety net): with the collector off, only the relay's own close does."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
