"""The proxy URL and key a run writes, and how a found value is judged.

Shared by every rewriter so that Python, JS, .env and YAML agree on what counts as
"already the proxy", "a literal to rewrite" and "a reference a human must follow".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from urllib.parse import urlsplit

DEFAULT_PROXY_URL = "http://127.0.0.1:4000/v1"
# Anthropic's SDKs (Python, TypeScript, the Claude Agent SDK, Claude Code) append
# `/v1/messages` to their base URL themselves: ANTHROPIC_BASE_URL is the proxy's root, with
# no `/v1`, where OPENAI_BASE_URL ends in `/v1`.
ANTHROPIC_URL_VARS = ("ANTHROPIC_BASE_URL",)
OPENAI_URL_VARS = ("OPENAI_BASE_URL", "OPENAI_API_BASE")
URL_VARS = (*OPENAI_URL_VARS, *ANTHROPIC_URL_VARS)
# ANTHROPIC_AUTH_TOKEN is sent as a Bearer token (Claude Code), ANTHROPIC_API_KEY as
# `x-api-key`: the proxy takes its key either way.
KEY_VARS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")

# Characters that would need escaping in some file kind. Refusing them up front lets every
# rewriter keep the original quote style with no escaping logic at all.
_UNSAFE = re.compile(r"[\s'\"`\\#$]")
# `$VAR` anywhere, not only leading: `https://$LLM_HOST/v1` is expanded by the shell or compose.
_REFERENCE = re.compile(r"\$\{|\$\(|\$[A-Za-z_]|\{\{|^\$\w|^os\.environ/")
# Azure OpenAI resource hosts: clients build deployment URLs under them, so pointing one at
# the proxy breaks it whatever the variable or framework that holds it.
_AZURE_HOSTS = (".openai.azure.com", ".cognitiveservices.azure.com", ".services.ai.azure.com")


@dataclass(frozen=True, slots=True)
class RewriteOptions:
    proxy_url: str
    proxy_key: str | None = None  # rewrite OPENAI_API_KEY only when the user asks for it

    @property
    def anthropic_url(self) -> str:
        """The proxy as an Anthropic SDK's base URL: `proxy_url` without its `/v1`."""
        return anthropic_base_url(self.proxy_url)

    def url_for(self, variable: str) -> str:
        """What an environment variable (or a client that reads it) is set to."""
        return self.anthropic_url if variable in ANTHROPIC_URL_VARS else self.proxy_url


def anthropic_base_url(proxy_url: str) -> str:
    return proxy_url.rstrip("/").removesuffix("/v1")


class Verdict(Enum):
    SAME = "same"  # already what we would write: nothing to do (idempotence)
    REWRITE = "rewrite"
    REFERENCE = "reference"  # ${VAR}, {{ secrets.X }}, os.environ/X: follow it by hand
    NOT_URL = "not_url"  # a literal that does not look like a URL: do not guess


def validate_proxy_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"proxy URL must be http(s)://host[:port]/path, got {url!r}")
    try:
        port = parts.port  # urlsplit checks the port only when it is read
    except ValueError:
        port = 0
    if port == 0:
        raise ValueError(f"proxy URL has an invalid port (1-65535): {url!r}")
    if _UNSAFE.search(url):
        raise ValueError(f"proxy URL must not contain spaces, quotes, '#', '$' or '\\': {url!r}")
    return url


def validate_proxy_key(key: str) -> str:
    if not key or _UNSAFE.search(key):
        raise ValueError("proxy key must be non-empty, without spaces, quotes, '#', '$' or '\\'")
    return key


def proxy_url_for_server(host: str, port: int) -> str:
    """The URL clients use to reach a proxy listening on host:port."""
    # A wildcard listen address is not something a client can dial in a config file.
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}/v1"


def is_reference(value: str) -> bool:
    return bool(_REFERENCE.search(value.strip()))


def is_azure_url(value: str) -> bool:
    """A URL on an Azure OpenAI resource: listed, never rewritten."""
    try:
        host = urlsplit(value.strip()).hostname or ""
    except ValueError:
        return False
    return host.endswith(_AZURE_HOSTS)


def same_url(a: str, b: str) -> bool:
    return a.strip().rstrip("/") == b.strip().rstrip("/")


def judge_url(value: str, proxy_url: str) -> Verdict:
    if same_url(value, proxy_url):
        return Verdict.SAME
    if is_reference(value):
        return Verdict.REFERENCE
    # An empty value means "use the default", which is api.openai.com: point it at the proxy.
    if value.strip() == "" or "://" in value:
        return Verdict.REWRITE
    return Verdict.NOT_URL


def judge_key(value: str, proxy_key: str) -> Verdict:
    if value == proxy_key:
        return Verdict.SAME
    if is_reference(value):
        return Verdict.REFERENCE
    return Verdict.REWRITE
