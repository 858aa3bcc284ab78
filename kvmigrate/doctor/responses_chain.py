"""The doctor's check of Responses API chains: an agent on `client.responses.create(...,
previous_response_id=...)` (the openai-agents SDK, Codex-style clients) needs the server to
keep its answers. vLLM keeps them only with its response store on, an environment variable
(`VLLM_ENABLE_RESPONSES_API_STORE`, vllm/envs.py); without it every second turn is a 404.
"""

from __future__ import annotations

from typing import Any

from kvmigrate.doctor.endpoint import Endpoint
from kvmigrate.doctor.result import CheckResult

NAME = "responses chains"
STORE_FIX = (
    "start vLLM with VLLM_ENABLE_RESPONSES_API_STORE=1 in its environment (it keeps every "
    "response in memory until it restarts); agents that resend their whole history "
    "(store: false) need nothing"
)


def _turn(model: str, text: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "input": text, "max_output_tokens": 16, **extra}


async def check_responses_chain(endpoint: Endpoint, model: str) -> CheckResult:
    """Two turns: a response, then one continuing it by `previous_response_id`."""
    first = await endpoint.post("responses", _turn(model, "Say hello."))
    response_id = first.body.get("id") if isinstance(first.body, dict) else None
    if not first.ok or not isinstance(response_id, str):
        return CheckResult(
            NAME, "fail", False,
            f"POST /v1/responses answered {first.status}: {first.error_message}",
            "use a vLLM with the Responses API (v0.10+) if agents use it",
        )  # fmt: skip
    second = await endpoint.post(
        "responses", _turn(model, "Again.", previous_response_id=response_id)
    )
    if second.ok:
        return CheckResult(NAME, "pass", False, "a previous_response_id chain continues")
    return CheckResult(
        NAME, "fail", False,
        f"continuing response {response_id} answered {second.status}: {second.error_message}",
        STORE_FIX,
    )  # fmt: skip
