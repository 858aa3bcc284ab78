"""Deterministic embeddings whose similarity follows shared words.

Each word adds a signed unit to two hashed dimensions (feature hashing), on top of a small
text-seeded base, and the vector is normalised: texts sharing words get a higher cosine
similarity, as with a real embedding model, at a cost of microseconds.
"""

from __future__ import annotations

import base64
import hashlib
import math
import random
import re
import struct

_WORD = re.compile(r"\w+")


def _word_slots(word: str, dimensions: int) -> list[tuple[int, float]]:
    digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
    first = int.from_bytes(digest[:4], "little")
    second = int.from_bytes(digest[4:], "little")
    return [
        (first % dimensions, 1.0 if first & 1 << 31 else -1.0),
        (second % dimensions, 0.5 if second & 1 << 31 else -0.5),
    ]


def embed(text: str, dimensions: int) -> list[float]:
    seed = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
    rng = random.Random(seed)
    vector = [rng.uniform(-0.05, 0.05) for _ in range(dimensions)]
    for word in _WORD.findall(text.lower()):
        for slot, weight in _word_slots(word, dimensions):
            vector[slot] += weight
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    return [v / norm for v in vector]


def encode(vector: list[float], encoding_format: str) -> list[float] | str:
    """Floats as they are, or base64 of little-endian float32, as the OpenAI API sends them."""
    if encoding_format == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return vector
