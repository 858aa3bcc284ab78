"""The conversations a benchmark drives: synthetic, or read from a JSONL file.

A conversation here is its system prompt and the user messages of each turn. The assistant
messages come from the server under test during the run, because an agent resends what the
model really answered, and that is what the server has cached.

Synthetic conversations open with a per-conversation nonce, so no two of them share a
cached prefix (a shared opening would make every conversation after the first look warm),
and a per-run salt, so a second run against the same server starts cold too.

Dataset lines are either OpenAI messages (`{"messages": [{"role", "content"}, ...]}`) or
ShareGPT (`{"conversations": [{"from": "human"|"gpt"|"system", "value"}, ...]}`).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvmigrate.datasets import DatasetError, jsonl_objects
from kvmigrate.wire.content import content_text

# Common English words: about one token each in BPE vocabularies (and exactly one in the
# emulator's and the test bed's), so `--system-tokens 1000` means about 1000 tokens.
_VOCABULARY_TEXT = (
    "the agent reads the file then calls a tool and writes a short reply to the user about "
    "request response stream token cache prefix model server client proxy route rollout "
    "search read write list update delete create open close send fetch parse render check "
    "python json yaml http status code value name arguments query path line test build run "
    "weather city temperature forecast order item price total customer ticket error retry "
    "history context window session message turn conversation budget config latency result"
)
_VOCABULARY = tuple(_VOCABULARY_TEXT.split())
_SHAREGPT_ROLES = {"human": "user", "user": "user", "system": "system", "gpt": "assistant"}


@dataclass(frozen=True, slots=True)
class Conversation:
    """`system` (may be empty) and the user message of each turn, in order."""

    id: str
    system: str
    user_turns: tuple[str, ...]


def words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(_VOCABULARY) for _ in range(count))


def synthetic(
    conversations: int,
    turns: int,
    system_tokens: int,
    turn_tokens: int,
    seed: int | None = None,
    salt: str | None = None,
) -> list[Conversation]:
    """`conversations` conversations of `turns` turns with unique openings.

    `seed` fixes the text; `salt` (default: fresh from the OS every call) opens every system
    prompt, so two calls with one seed give prompts of the same shape that share no cached
    prefix: a `--vs` run against the same server is as cold as the first one."""
    rng = random.Random(seed)
    run_salt = salt if salt is not None else f"{random.SystemRandom().getrandbits(48):012x}"
    result = []
    for index in range(conversations):
        nonce = f"{run_salt}-{index:05d}"
        system = f"Session {nonce}. You are a careful agent. " + words(rng, system_tokens)
        user_turns = tuple(f"Step {turn + 1}: " + words(rng, turn_tokens) for turn in range(turns))
        result.append(Conversation(nonce, system, user_turns))
    return result


def load_dataset(path: Path, conversations: int, turns: int) -> list[Conversation]:
    """The first `conversations` usable conversations of a JSONL file, each cut to `turns`."""
    result: list[Conversation] = []
    for number, where, record in jsonl_objects(path):
        system, users = _parse_record(record, where)
        if users:
            result.append(Conversation(f"{path.name}:{number}", system, users[:turns]))
        if len(result) == conversations:
            break
    if not result:
        raise DatasetError(f"{path}: no conversation with a user message")
    return result


def _parse_record(record: Any, where: str) -> tuple[str, tuple[str, ...]]:
    if isinstance(record, dict) and isinstance(record.get("messages"), list):
        pairs = _openai_messages(record["messages"], where)
    elif isinstance(record, dict) and isinstance(record.get("conversations"), list):
        pairs = _sharegpt_messages(record["conversations"], where)
    else:
        raise DatasetError(f"{where}: expected an object with `messages` or `conversations`")
    system = "\n".join(text for role, text in pairs if role == "system")
    users = tuple(text for role, text in pairs if role == "user")
    return system, users


def _openai_messages(messages: Iterable[Any], where: str) -> list[tuple[str, str]]:
    pairs = []
    for message in messages:
        if not isinstance(message, dict):
            raise DatasetError(f"{where}: every message must be an object")
        role = message.get("role")
        text = content_text(message.get("content"), sep="\n")
        if role in ("system", "developer"):
            pairs.append(("system", text))
        elif role in ("user", "assistant", "tool"):
            pairs.append((str(role), text))
    return pairs


def _sharegpt_messages(turns: Iterable[Any], where: str) -> list[tuple[str, str]]:
    pairs = []
    for turn in turns:
        if not isinstance(turn, dict) or "from" not in turn:
            raise DatasetError(f"{where}: every ShareGPT turn needs `from` and `value`")
        role = _SHAREGPT_ROLES.get(str(turn["from"]).lower())
        if role is not None:
            pairs.append((role, content_text(turn.get("value"), sep="\n")))
    return pairs
