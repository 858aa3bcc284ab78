"""Fault injection: aimed by header (with target filtering) or drawn at random rates."""

from __future__ import annotations

import http.client
import json
import re
import time
from collections.abc import Iterable

import openai
import pytest
from emulator_support import StartEmulator, chat_body, client, model_of, raw, sse_data

from kvmigrate.emulator import FAULT_HEADER, FaultRates
from kvmigrate.emulator.faults import parse_fault_header
from kvmigrate.serving import BackgroundServer

ASK = [{"role": "user", "content": "Describe the tides"}]


def _fault(value: str) -> dict[str, str]:
    return {FAULT_HEADER: value}


def _drain(stream: Iterable[object], received: list[object] | None = None) -> None:
    for chunk in stream:
        if received is not None:
            received.append(chunk)


def test_parse_fault_header() -> None:
    plan = parse_fault_header("vllm:503, hosted:429, slow-first-byte=0.5, stall", "vllm")
    assert plan.status == 503
    assert plan.slow_first_byte_s == 0.5
    assert plan.stall_s == float("inf")
    assert plan.names == ("503", "slow-first-byte", "stall")
    assert parse_fault_header("candidate:disconnect", "primary").names == ()
    assert parse_fault_header("429=7", "x").retry_after_s == 7
    with pytest.raises(ValueError, match="unknown emulator fault"):
        parse_fault_header("other:explode", "vllm")
    with pytest.raises(ValueError, match="seconds"):
        parse_fault_header("slow-first-byte", "vllm")


@pytest.mark.parametrize("status", [500, 503, 502])
def test_status_faults(any_server: BackgroundServer, status: int) -> None:
    code, _, body = raw(
        any_server, "POST", "/v1/chat/completions", chat_body(any_server, "hi"), _fault(str(status))
    )
    assert code == status
    assert "message" in json.loads(body)["error"]


def test_status_fault_through_sdk(hosted_server: BackgroundServer) -> None:
    with (
        client(hosted_server, default_headers=_fault("500")) as sdk,
        pytest.raises(openai.InternalServerError) as caught,
    ):
        sdk.chat.completions.create(model=model_of(hosted_server), messages=ASK)  # type: ignore[arg-type]
    assert caught.value.body == {
        "message": "The server had an error while processing your request. Sorry about that!",
        "type": "server_error",
        "param": None,
        "code": None,
    }


def test_rate_limit_fault(any_server: BackgroundServer) -> None:
    status, headers, body = raw(
        any_server, "POST", "/v1/chat/completions", chat_body(any_server, "hi"), _fault("429=2")
    )
    assert status == 429
    assert headers["Retry-After"] == "2"
    error = json.loads(body)["error"]
    assert error["code"] in ("rate_limit_exceeded", 429)


def test_target_filtering(start_emulator: StartEmulator) -> None:
    candidate = start_emulator("vllm", name="candidate")
    body = chat_body(candidate, "hi")
    assert raw(candidate, "POST", "/v1/chat/completions", body, _fault("primary:500"))[0] == 200
    assert raw(candidate, "POST", "/v1/chat/completions", body, _fault("candidate:500"))[0] == 500
    assert raw(candidate, "POST", "/v1/chat/completions", body, _fault("500"))[0] == 500
    assert raw(candidate, "POST", "/v1/chat/completions", body, _fault("bogus"))[0] == 400
    metrics = raw(candidate, "GET", "/metrics")[2].decode()
    assert re.search(r'^emulator_faults_total\{fault="500"\} 2\.0$', metrics, re.MULTILINE)


def test_faults_on_other_endpoints(any_server: BackgroundServer) -> None:
    assert raw(any_server, "GET", "/v1/models", headers=_fault("503"))[0] == 503
    assert raw(any_server, "GET", "/health", headers=_fault("500"))[0] == 500
    status, _, body = raw(any_server, "GET", "/v1/models", headers=_fault("malformed-json"))
    assert status == 200
    with pytest.raises(json.JSONDecodeError):
        json.loads(body)


def test_slow_first_byte(vllm_server: BackgroundServer) -> None:
    started = time.perf_counter()
    status = raw(vllm_server, "GET", "/v1/models", headers=_fault("slow-first-byte=0.3"))[0]
    assert status == 200
    assert time.perf_counter() - started >= 0.3


def test_stall_then_resume(vllm_server: BackgroundServer) -> None:
    body = chat_body(vllm_server, "hi", stream=True)
    started = time.perf_counter()
    status, _, raw_body = raw(
        vllm_server, "POST", "/v1/chat/completions", body, _fault("stall=0.3")
    )
    assert status == 200
    assert time.perf_counter() - started >= 0.3
    assert sse_data(raw_body)[-1] == "[DONE]"


def test_stall_forever_times_out_client(start_emulator: StartEmulator) -> None:
    server = start_emulator("vllm")
    with client(server, timeout=0.4, default_headers=_fault("stall")) as sdk:
        stream = sdk.chat.completions.create(model=model_of(server), messages=ASK, stream=True)  # type: ignore[arg-type]
        with pytest.raises(openai.APITimeoutError):
            _drain(stream)
        stream.close()


def test_hang_times_out_client(start_emulator: StartEmulator) -> None:
    server = start_emulator("hosted")
    with (
        client(server, timeout=0.3, default_headers=_fault("hang")) as sdk,
        pytest.raises(openai.APITimeoutError),
    ):
        sdk.chat.completions.create(model=model_of(server), messages=ASK)  # type: ignore[arg-type]


def test_disconnect_mid_stream(any_server: BackgroundServer) -> None:
    with client(any_server, default_headers=_fault("disconnect")) as sdk:
        stream = sdk.chat.completions.create(
            model=model_of(any_server),
            messages=ASK,  # type: ignore[arg-type]
            stream=True,
        )
        received: list[object] = []
        with pytest.raises(openai.APIConnectionError):
            _drain(stream, received)
        stream.close()
    assert len(received) >= 1  # the connection drops mid-stream, not before it


def test_disconnect_mid_body(any_server: BackgroundServer) -> None:
    with pytest.raises(http.client.IncompleteRead):
        raw(
            any_server,
            "POST",
            "/v1/chat/completions",
            chat_body(any_server, "hi"),
            _fault("disconnect"),
        )
    with (
        client(any_server, default_headers=_fault("disconnect")) as sdk,
        pytest.raises(openai.APIConnectionError),
    ):
        sdk.chat.completions.create(model=model_of(any_server), messages=ASK)  # type: ignore[arg-type]


def test_malformed_json_body(any_server: BackgroundServer) -> None:
    status, _, body = raw(
        any_server,
        "POST",
        "/v1/chat/completions",
        chat_body(any_server, "hi"),
        _fault("malformed-json"),
    )
    assert status == 200
    with pytest.raises(json.JSONDecodeError):
        json.loads(body)


def test_malformed_sse(any_server: BackgroundServer) -> None:
    body = chat_body(any_server, "hi", stream=True)
    status, _, raw_body = raw(
        any_server, "POST", "/v1/chat/completions", body, _fault("malformed-sse")
    )
    assert status == 200
    payloads = sse_data(raw_body)
    assert payloads[-1] == "[DONE]"
    broken = []
    for payload in payloads[:-1]:
        try:
            json.loads(payload)
        except json.JSONDecodeError:
            broken.append(payload)
    assert broken
    with client(any_server, default_headers=_fault("malformed-sse")) as sdk:
        stream = sdk.chat.completions.create(
            model=model_of(any_server),
            messages=ASK,  # type: ignore[arg-type]
            stream=True,
        )
        with pytest.raises(json.JSONDecodeError):
            _drain(stream)
        stream.close()


def test_random_fault_rates(start_emulator: StartEmulator) -> None:
    always = start_emulator("vllm", faults=FaultRates(error_rate=1.0), fault_seed=1)
    never = start_emulator("vllm", faults=FaultRates(error_rate=0.0), fault_seed=1)
    limited = start_emulator("hosted", faults=FaultRates(rate_limit_rate=1.0), fault_seed=1)
    assert {
        raw(always, "POST", "/v1/chat/completions", chat_body(always, "x"))[0] for _ in range(5)
    } == {500}
    assert {
        raw(never, "POST", "/v1/chat/completions", chat_body(never, "x"))[0] for _ in range(5)
    } == {200}
    status, headers, _ = raw(limited, "POST", "/v1/chat/completions", chat_body(limited, "x"))
    assert status == 429
    assert "Retry-After" in headers
    half = start_emulator("vllm", faults=FaultRates(error_rate=0.5), fault_seed=7)
    statuses = [
        raw(half, "POST", "/v1/chat/completions", chat_body(half, "x"))[0] for _ in range(40)
    ]
    assert 5 < statuses.count(500) < 35
