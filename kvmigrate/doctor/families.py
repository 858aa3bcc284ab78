"""Which `--tool-call-parser` a model family needs, from its name.

vLLM parses tool calls out of the generated text, and each model family writes them in its
own format, so the parser must match the model: the wrong one silently returns the call as
plain text. The names are vLLM's own parser names.
"""

from __future__ import annotations

# Most specific first: "qwen3-coder" before "qwen", "llama-4" before "llama".
_PARSERS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("gpt-oss",), "openai"),
    (("llama-4", "llama4"), "llama4_pythonic"),
    (("llama-3", "llama3", "llama-3.1", "llama-3.2", "llama-3.3"), "llama3_json"),
    (("qwen3-coder",), "qwen3_coder"),
    (("qwen", "hermes"), "hermes"),
    (("mistral", "mixtral", "ministral", "devstral", "codestral", "magistral"), "mistral"),
    (("deepseek-v3.1",), "deepseek_v31"),
    (("deepseek-v3", "deepseek-r1"), "deepseek_v3"),
    (("granite",), "granite"),
    (("internlm",), "internlm"),
    (("phi-4-mini",), "phi4_mini_json"),
    (("kimi-k2",), "kimi_k2"),
    (("glm-4.5", "glm-4.6"), "glm45"),
    (("glm-4.7",), "glm47"),
    (("minimax-m2",), "minimax_m2"),
    (("jamba",), "jamba"),
)
UNKNOWN_FAMILY_HINT = (
    "hermes for Qwen and Hermes models, llama3_json for Llama 3.x, llama4_pythonic for "
    "Llama 4, mistral for Mistral, openai for gpt-oss"
)


def tool_parser(*names: str) -> str | None:
    """The parser for the first of `names` (a served name, an HF id, a path) that matches."""
    for name in names:
        lowered = name.lower()
        for needles, parser in _PARSERS:
            if any(needle in lowered for needle in needles):
                return parser
    return None


def tool_flags(*names: str) -> str:
    """The exact flags to add, or the flags with a placeholder and the known parsers."""
    parser = tool_parser(*names)
    if parser is not None:
        return f"--enable-auto-tool-choice --tool-call-parser {parser}"
    return f"--enable-auto-tool-choice --tool-call-parser PARSER ({UNKNOWN_FAMILY_HINT})"
