"""LiteLLM-style model prefixes (`ollama/llama3`, `azure/gpt4-deploy`): which the proxy serves.

LiteLLM, DSPy and CrewAI pick the wire protocol from the model's prefix, not from the base
URL. The proxy relays the OpenAI and the Anthropic APIs only, so a URL next to any other
prefix must not become the proxy's: that client would speak Ollama's or Vertex's API to it.
"""

from __future__ import annotations

from enum import Enum

# Prefixes whose requests are OpenAI's API at `api_base`; no prefix means OpenAI too.
_OPENAI = frozenset(
    {"", "openai", "text-completion-openai", "hosted_vllm", "custom_openai", "openai_like"}
)
_AZURE = frozenset({"azure", "azure_ai", "azure_text"})
_BEDROCK = frozenset({"bedrock", "bedrock_converse", "sagemaker", "sagemaker_chat"})
UNSERVED_FLAG = (
    "{provider} models do not speak the OpenAI or Anthropic API, the only two the proxy "
    "relays: leave this URL, or serve the model from a kvmigrate backend and call the proxy "
    "as openai/<model>"
)


class Route(Enum):
    OPENAI = "openai"  # the proxy URL, with /v1
    ANTHROPIC = "anthropic"  # the proxy's root: the client appends /v1/messages
    AZURE = "azure"  # flagged: deployment URLs
    BEDROCK = "bedrock"  # flagged: AWS-signed, not an OpenAI API
    UNSERVED = "unserved"  # flagged: an API the proxy does not relay


def provider_of(model: str) -> str:
    """`ollama/llama3` -> `ollama`; a bare model name has no provider ("")."""
    return model.split("/", 1)[0].strip().lower() if "/" in model else ""


def route(provider: str) -> Route:
    if provider in _OPENAI:
        return Route.OPENAI
    if provider == "anthropic":
        return Route.ANTHROPIC
    if provider in _AZURE:
        return Route.AZURE
    if provider in _BEDROCK:
        return Route.BEDROCK
    return Route.UNSERVED
