"""Which Python calls create an LLM client, where each takes its URL, and what to say about it.

Keyed by (top-level package, symbol) so that `langchain_openai.ChatOpenAI` and
`langchain_openai.chat_models.base.ChatOpenAI` match the same rule, while LlamaIndex's
`OpenAI` (package `llama_index`) is told apart from the SDK's `openai.OpenAI`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class CallRule:
    framework: str
    url_kwargs: tuple[str, ...]  # keyword arguments that carry the base URL
    env_var: str  # what the client reads when no URL is passed
    flag: str | None = None  # set for clients a URL change cannot move: the proposed change
    # LiteLLM-style: the model's `provider/` prefix (keyword `model` or the first positional
    # argument) picks the API spoken at the URL (providers.py).
    prefixed: bool = False


_AZURE = (
    "Azure OpenAI clients ignore OPENAI_BASE_URL and build deployment URLs: replace with "
    "OpenAI(base_url=<proxy>) and map the deployment to a model in the kvmigrate config"
)
_BEDROCK = (
    "Bedrock does not speak the OpenAI API: call the proxy with OpenAI(base_url=<proxy>) and "
    "serve the model from a kvmigrate backend instead"
)
_ANTHROPIC_CLOUD = (
    "AnthropicBedrock and AnthropicVertex sign requests for AWS or Google Cloud and use their "
    "paths, not /v1/messages: replace with Anthropic(base_url=<proxy root>) and serve the "
    "model from a kvmigrate backend instead"
)
_OPENAI = CallRule("openai", ("base_url",), "OPENAI_BASE_URL")
# The Anthropic SDK's base URL is the proxy's root (it appends /v1/messages itself);
# LangChain's ChatAnthropic passes `anthropic_api_url` (alias `base_url`) to it unchanged.
_ANTHROPIC = CallRule("anthropic", ("base_url",), "ANTHROPIC_BASE_URL")
_LANGCHAIN_ANTHROPIC = CallRule(
    "langchain", ("anthropic_api_url", "base_url"), "ANTHROPIC_BASE_URL"
)
_LANGCHAIN = CallRule("langchain", ("base_url", "openai_api_base"), "OPENAI_API_BASE")
_LLAMAINDEX = CallRule("llamaindex", ("api_base",), "OPENAI_API_BASE")
_LITELLM = CallRule("litellm", ("api_base", "base_url"), "OPENAI_API_BASE", prefixed=True)

CALL_RULES: Mapping[tuple[str, str], CallRule] = MappingProxyType(
    {
        ("openai", "OpenAI"): _OPENAI,
        ("openai", "AsyncOpenAI"): _OPENAI,
        ("openai", "Client"): _OPENAI,
        ("openai", "AsyncClient"): _OPENAI,
        ("openai", "AzureOpenAI"): CallRule("azure", (), "", _AZURE),
        ("openai", "AsyncAzureOpenAI"): CallRule("azure", (), "", _AZURE),
        ("anthropic", "Anthropic"): _ANTHROPIC,
        ("anthropic", "AsyncAnthropic"): _ANTHROPIC,
        ("anthropic", "Client"): _ANTHROPIC,
        ("anthropic", "AsyncClient"): _ANTHROPIC,
        ("anthropic", "AnthropicBedrock"): CallRule("bedrock", (), "", _ANTHROPIC_CLOUD),
        ("anthropic", "AsyncAnthropicBedrock"): CallRule("bedrock", (), "", _ANTHROPIC_CLOUD),
        ("anthropic", "AnthropicVertex"): CallRule("vertex", (), "", _ANTHROPIC_CLOUD),
        ("anthropic", "AsyncAnthropicVertex"): CallRule("vertex", (), "", _ANTHROPIC_CLOUD),
        ("langchain_anthropic", "ChatAnthropic"): _LANGCHAIN_ANTHROPIC,
        ("langchain_openai", "ChatOpenAI"): _LANGCHAIN,
        ("langchain_openai", "OpenAI"): _LANGCHAIN,
        ("langchain_openai", "OpenAIEmbeddings"): _LANGCHAIN,
        ("langchain_community", "ChatOpenAI"): _LANGCHAIN,
        ("langchain_community", "OpenAI"): _LANGCHAIN,
        ("langchain", "ChatOpenAI"): _LANGCHAIN,
        ("langchain_openai", "AzureChatOpenAI"): CallRule("langchain", (), "", _AZURE),
        ("langchain_aws", "ChatBedrock"): CallRule("bedrock", (), "", _BEDROCK),
        ("langchain_aws", "ChatBedrockConverse"): CallRule("bedrock", (), "", _BEDROCK),
        ("llama_index", "OpenAI"): _LLAMAINDEX,
        ("llama_index", "OpenAILike"): _LLAMAINDEX,
        ("llama_index", "OpenAIEmbedding"): _LLAMAINDEX,
        ("llama_index", "AzureOpenAI"): CallRule("llamaindex", (), "", _AZURE),
        ("litellm", "completion"): _LITELLM,
        ("litellm", "acompletion"): _LITELLM,
        ("litellm", "embedding"): _LITELLM,
        ("litellm", "aembedding"): _LITELLM,
        ("dspy", "LM"): CallRule(
            "dspy", ("api_base", "base_url"), "OPENAI_API_BASE", prefixed=True
        ),
        ("crewai", "LLM"): CallRule(
            "crewai", ("base_url", "api_base"), "OPENAI_API_BASE", prefixed=True
        ),
        ("autogen_ext", "OpenAIChatCompletionClient"): CallRule(
            "autogen", ("base_url",), "OPENAI_BASE_URL"
        ),
        ("autogen_ext", "AzureOpenAIChatCompletionClient"): CallRule("autogen", (), "", _AZURE),
    }
)

# Calls that wrap a client built inside them: the inner client is reported under this name.
WRAPPERS: Mapping[tuple[str, str], str] = MappingProxyType(
    {("instructor", "from_openai"): "instructor", ("instructor", "patch"): "instructor"}
)

# Module attributes that set the SDK-wide URL (v1 and the legacy v0 name).
MODULE_URL_ATTRS = frozenset({"base_url", "api_base"})
BEDROCK = CallRule("bedrock", (), "", _BEDROCK)
AZURE = CallRule("azure", (), "", _AZURE)
CONFIG_LIST_URL_KEYS = ("base_url", "api_base")
