"""The /v1 paths the proxy serves itself (the model routes), and the check that keeps every
other path a plain pass-through: a path that decodes to a model route never reaches the
primary past the allowlist, the duplicate-model check, the rollout, copies and records."""

from __future__ import annotations

import re

from aiohttp import web

from kvmigrate.logtext import printable
from kvmigrate.proxy.errors import bad_request
from kvmigrate.proxy.upstream import safe_suffix

MODEL_ROUTES = (
    "chat/completions",
    "completions",
    "embeddings",
    "responses",
    "messages",  # Anthropic's Messages API (wire.anthropic)
    "messages/count_tokens",
)
# aiohttp decodes the path before routing and `match_info` see it, so `/v1/chat%2Fcompletions`
# matches the pass-through route yet names /v1/chat/completions upstream. Only the raw path
# still shows the encoding. No client encodes `.` (unreserved), so `%2e` is only ever a
# dot-segment in disguise.
_ENCODED_SEPARATOR = re.compile(r"%(?:2f|5c|2e)", re.IGNORECASE)


def passthrough_suffix(request: web.Request) -> str:
    """The checked path below /v1 of a pass-through request; a 400 for any path trick."""
    raw_path = request.raw_path.partition("?")[0]  # a query may encode what it likes
    if _ENCODED_SEPARATOR.search(raw_path):
        raise bad_request(
            f"Unsupported path: {printable(raw_path)}: a path may not percent-encode "
            "`/`, `\\` or `.` (%2F, %5C, %2E)."
        )
    suffix = safe_suffix(request.match_info["suffix"])
    # `/v1/chat/completions/` or `/v1/Chat/Completions` would reach a lenient upstream's
    # model route too; only the exact path gets the model routes' controls.
    route = suffix.rstrip("/").lower()
    if request.method == "POST" and route in MODEL_ROUTES:
        raise bad_request(
            f"Unsupported path: {printable(request.path)}: send this request to /v1/{route}."
        )
    return suffix
