"""The thresholds that turn comparator scores into agree/disagree, in one frozen value.

Defaults are set so that two samples of the same model at ordinary temperatures agree (see
tests/parity/test_parity_quality.py for the measured false-alarm rate), while the injected
divergences of that set are flagged. Disagreement that remains is what noise calibration
subtracts.
"""

from __future__ import annotations

from dataclasses import dataclass

# Fields vLLM adds that OpenAI never sends (../shared/notes/wire-formats.md). Paths use
# `[]` for "any list element"; a pattern ending in `.*` covers a whole subtree.
VLLM_EXTRAS: tuple[str, ...] = (
    "choices[].stop_reason",
    "choices[].prompt_logprobs",
    "choices[].token_ids",
    "choices[].message.reasoning_content",
    "choices[].message.reasoning",
    "prompt_logprobs",
    "prompt_token_ids",
    "prompt_text",
    "kv_transfer_params",
    "usage.prompt_tokens_details.created_cache_tokens",
)
# Fields OpenAI sends that vLLM leaves null or out. usage.completion_tokens_details is not
# in the notes, but vLLM has never filled it, and clients treat it as optional.
VLLM_ABSENT: tuple[str, ...] = (
    "system_fingerprint",
    "service_tier",
    "choices[].message.refusal",
    "choices[].message.annotations",
    "usage.prompt_tokens_details.*",
    "usage.completion_tokens_details.*",
    # Anthropic's Messages usage: vLLM's /v1/messages fills only input/output tokens, and
    # the cache counts only when prompt-token details are on; the SDKs type all as optional.
    "usage.cache_creation_input_tokens",
    "usage.cache_read_input_tokens",
    "usage.cache_creation.*",
    "usage.server_tool_use.*",
    "usage.service_tier",
    "usage.inference_geo",
)


@dataclass(frozen=True, slots=True)
class ParitySettings:
    """text_min_similarity: fuzzy similarity (rapidfuzz Indel ratio, 0..1) below which two
        texts disagree.
    topic_min_coverage: how many of the request's key terms the candidate's answer must use,
        as a share of those the primary's answer uses; it must use at least one.
    length_min_ratio: shorter / longer answer length below which lengths disagree.
    semantic_min_similarity: embedding cosine below which meanings disagree (optional).
    allowed_extra / allowed_missing: API-shape paths the candidate may add or leave out.
    max_text_chars: texts are cut to this before fuzzy matching, which is quadratic.
    """

    text_min_similarity: float = 0.45
    topic_min_coverage: float = 0.25
    length_min_ratio: float = 0.5
    semantic_min_similarity: float = 0.7
    allowed_extra: tuple[str, ...] = VLLM_EXTRAS
    allowed_missing: tuple[str, ...] = VLLM_ABSENT
    max_text_chars: int = 20_000
