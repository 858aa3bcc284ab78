"""The answer's `model` as the client asked for it (`server.answer_model: requested`).

A candidate answers with the name it serves (`meta-llama/...`) where the hosted API echoes
the client's; clients that check it see the difference. The fix is a byte replacement of the
`"model":"<served>"` pair in each relayed chunk, with and without the space after the colon
(the two spellings servers use), never a parse. A chunk cut inside the pair keeps the served
name in that one event. The record keeps the backend's own bytes.
"""

from __future__ import annotations

from collections.abc import Callable

import orjson

Rewrite = Callable[[bytes], bytes]


def answer_model_rewrite(served: str, requested: str) -> Rewrite | None:
    """The chunk rewrite for an answer of `served` to a client that asked for `requested`;
    None when the names are the same (nothing to do)."""
    if served == requested:
        return None
    old, new = orjson.dumps(served), orjson.dumps(requested)
    compact = (b'"model":' + old, b'"model":' + new)
    spaced = (b'"model": ' + old, b'"model": ' + new)
    needle = old  # cheapest test: most chunks (text deltas) do not name the model at all

    def rewrite(chunk: bytes) -> bytes:
        if needle not in chunk:
            return chunk
        return chunk.replace(*compact).replace(*spaced)

    return rewrite
