"""Split mode: sticky, monotone conversation buckets, transparent fallback, clean stream errors."""

from __future__ import annotations

import openai
import pytest
from proxy_support import FAULTS_ALLOWED, HOSTED_MODEL, ProxyFactory, RunningProxy


def conversation(proxy: RunningProxy, name: str, turns: int = 3) -> list[str]:
    """Run a multi-turn conversation and return the backend that served each turn."""
    client = proxy.client()
    messages: list[dict[str, object]] = [
        {"role": "system", "content": "You are a terse agent."},
        {"role": "user", "content": f"Start task {name}."},
    ]
    served = []
    for _ in range(turns):
        raw = client.chat.completions.with_raw_response.create(
            model=HOSTED_MODEL, messages=messages
        )
        served.append(raw.headers["x-kvmigrate-backend"])
        messages += [
            raw.parse().choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": "continue"},
        ]
    return served


def test_conversations_stick_to_one_backend(make_proxy: ProxyFactory) -> None:
    proxy = make_proxy(rollout="{mode: split, percent: 50}")
    placements = [conversation(proxy, f"c{i}") for i in range(12)]
    assert all(len(set(turns)) == 1 for turns in placements)
    assert {turns[0] for turns in placements} == {"hosted", "vllm"}


def test_session_header_and_user_are_conversation_keys(make_proxy: ProxyFactory) -> None:
    proxy = make_proxy(rollout="{mode: split, percent: 50}")
    client = proxy.client()
    for key in ("x-session-id", "user"):
        backends = set()
        for i in range(6):  # different first messages, same session: one backend
            kwargs: dict[str, object] = (
                {"user": "agent-7"}
                if key == "user"
                else {"extra_headers": {"X-Session-ID": "session-42"}}
            )
            raw = client.chat.completions.with_raw_response.create(
                model=HOSTED_MODEL, messages=[{"role": "user", "content": f"q{i}"}], **kwargs
            )
            backends.add(raw.headers["x-kvmigrate-backend"])
        assert len(backends) == 1


@pytest.mark.slow
def test_raising_the_percent_never_moves_a_candidate_conversation_back(
    make_proxy: ProxyFactory,
) -> None:
    at_10 = make_proxy(rollout="{mode: split, percent: 10}")
    at_50 = make_proxy(rollout="{mode: split, percent: 50}")
    names = [f"conv-{i}" for i in range(40)]
    on_candidate_10 = {n for n in names if conversation(at_10, n, 1) == ["vllm"]}
    on_candidate_50 = {n for n in names if conversation(at_50, n, 1) == ["vllm"]}
    assert on_candidate_10 <= on_candidate_50
    assert len(on_candidate_10) < len(on_candidate_50)


@pytest.mark.parametrize(
    ("fault", "stream"),
    [(f, s) for f in ("vllm:503", "vllm:500", "vllm:hang") for s in (False, True)]
    # A disconnect strikes mid-body: before any byte when not streamed, after some when
    # streamed (see test_failure_after_bytes_ends_stream_with_an_error_event).
    + [("vllm:disconnect", False)],
)
def test_candidate_failure_before_first_byte_falls_back(
    make_proxy: ProxyFactory, fault: str, stream: bool
) -> None:
    proxy = make_proxy(rollout="{mode: split, percent: 100}", vllm_extra=FAULTS_ALLOWED)
    client = proxy.client()
    messages = [{"role": "user", "content": "hello"}]
    raw = client.chat.completions.with_raw_response.create(
        model=HOSTED_MODEL,
        messages=messages,
        stream=stream,
        extra_headers={"x-emulator-fault": fault},
    )
    assert raw.headers["x-kvmigrate-backend"] == "hosted"
    if stream:
        assert "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    else:
        assert raw.parse().choices[0].message.content
    assert proxy.metric("kvmigrate_fallbacks_total") == 1


def test_fallback_can_be_switched_off(make_proxy: ProxyFactory) -> None:
    proxy = make_proxy(
        rollout="{mode: split, percent: 100, fallback: false}", vllm_extra=FAULTS_ALLOWED
    )
    with pytest.raises(openai.InternalServerError):
        proxy.client().chat.completions.create(
            model=HOSTED_MODEL,
            messages=[{"role": "user", "content": "x"}],
            extra_headers={"x-emulator-fault": "vllm:503"},
        )
    assert proxy.metric("kvmigrate_fallbacks_total") == 0


@pytest.mark.parametrize("fault", ["vllm:disconnect", "vllm:stall"])
def test_failure_after_bytes_ends_stream_with_an_error_event(
    make_proxy: ProxyFactory, fault: str
) -> None:
    proxy = make_proxy(rollout="{mode: split, percent: 100}", vllm_extra=FAULTS_ALLOWED)
    stream = proxy.client().chat.completions.create(
        model=HOSTED_MODEL,
        messages=[{"role": "user", "content": "tell me a long story"}],
        stream=True,
        max_tokens=200,
        extra_headers={"x-emulator-fault": fault},
    )
    received: list[object] = []
    with pytest.raises(openai.APIError) as caught:
        received.extend(stream)
    assert received, "the failure should strike after some chunks were relayed"
    assert "broke off" in str(caught.value)
    assert proxy.metric("kvmigrate_errors_total", backend="vllm") == 1
