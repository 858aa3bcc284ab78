"""Deterministic answer text that relates to the prompt, with realistic variation.

An answer is a few template sentences filled from small word lists and from the topic words
of the last user message, so an answer about another topic is detectable. Two random streams
drive it: the base stream, seeded from the prompt (and the request's `seed`), picks every
word; the noise stream overrides a share of those picks. That share is `noise` times the
request's temperature: at 0 the answer is a pure function of the prompt and seed. Without a
seed the noise stream is unseeded, so two calls differ by a few words or a reworded sentence,
like two samples of a real model; with a seed it is seeded too, so the call is reproducible.
A test bed that must replay unseeded calls exactly seeds their noise stream alone
(`x-emulator-noise-seed`), leaving the base stream the prompt's.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from kvmigrate.emulator.schema_values import SchemaValues
from kvmigrate.emulator.tokens import count_tokens, tokenize, words

T = TypeVar("T")

_STOPWORD_TEXT = (
    "the and for are but not you all any can had her was one our out has his how its may new "
    "now old see two way who did get let put say she too use what with this that from have "
    "they will would there their been were which when your about into more some than them "
    "then these could other like just also only tell please give explain write make does "
    "should where why summarise summarize describe discuss list show compare provide help "
    "using want need know think find plan invent"
)
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())
_LEADS = (
    "Here is a short answer about {topic}.",
    "Let me explain {topic} briefly.",
    "Good question about {topic}.",
    "Sure, here is an overview of {topic}.",
)
_SENTENCES = (
    "{open} {topic} {verb} the {adj} {noun}.",
    "The {adj} {noun} of {topic} {verb} every {noun2} {adv}.",
    "When {topic} {verb} a {noun}, the {noun2} changes {adv}.",
    "A {adj} view of {topic} treats it as a {noun} that {verb} the {noun2}.",
    "In practice, {topic} {verb} the {noun} {adv}.",
    "This is why {topic} matters for a {adj} {noun}.",
)
_OPENS = ("Overall,", "In short,", "Put simply,", "Broadly,", "Notably,", "Usually,")
_VERBS = ("shapes", "improves", "affects", "supports", "reflects", "changes", "drives", "limits")
_ADJS = ("simple", "careful", "practical", "common", "useful", "clear", "steady", "flexible")
_NOUNS = ("process", "result", "pattern", "system", "approach", "detail", "choice", "method")
_ADVS = ("quickly", "gradually", "reliably", "noticeably", "over time", "in most cases")
_GENERAL_TOPICS = ("this topic", "the question", "the idea")


def stable_seed(*parts: object) -> int:
    """A seed that is the same in every process (unlike `hash`)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def topic_words(text: str, limit: int = 8) -> list[str]:
    seen: dict[str, str] = {}
    for word in words(text):
        key = word.lower()
        if key not in _STOPWORDS and key not in seen:
            seen[key] = word
        if len(seen) >= limit:
            break
    return list(seen.values())


class _Chooser:
    """Picks from the base stream, except for a `share` of picks taken from the noise stream.

    The base stream is always consumed, so one noisy pick does not shift all later ones."""

    def __init__(self, base: random.Random, noise: random.Random, share: float) -> None:
        self._base = base
        self._noise = noise
        self._share = share

    def pick(self, options: Sequence[T]) -> T:
        index = self._base.randrange(len(options))
        if self._share > 0 and self._noise.random() < self._share:
            index = self._noise.randrange(len(options))
        return options[index]


@dataclass(frozen=True, slots=True)
class Sampling:
    """What varies one answer: the prompt identity, the request's seed and temperature."""

    prompt_key: str
    seed: int | None
    temperature: float | None
    noise: float
    choice_index: int = 0
    noise_seed: int | None = None

    @property
    def share(self) -> float:
        temperature = 1.0 if self.temperature is None else min(max(self.temperature, 0.0), 2.0)
        return min(self.noise * temperature, 1.0)

    def base_rng(self) -> random.Random:
        return random.Random(stable_seed("base", self.prompt_key, self.seed))

    def noise_rng(self) -> random.Random:
        if self.seed is None:
            if self.noise_seed is None:
                return random.Random()
            return random.Random(stable_seed("noise-call", self.noise_seed, self.choice_index))
        return random.Random(stable_seed("noise", self.prompt_key, self.seed, self.choice_index))


def answer_text(topic_text: str, sampling: Sampling, min_tokens: int, max_tokens: int) -> str:
    """Free text of min_tokens..max_tokens tokens (drawn per prompt), ending on a sentence."""
    base = sampling.base_rng()
    chooser = _Chooser(base, sampling.noise_rng(), sampling.share)
    target = base.randint(min_tokens, max_tokens)
    topics = topic_words(topic_text) or list(_GENERAL_TOPICS)
    sentences = [chooser.pick(_LEADS).format(topic=topics[0])]
    length = count_tokens(sentences[0])
    while length < target:
        sentence = chooser.pick(_SENTENCES).format(
            open=chooser.pick(_OPENS),
            topic=chooser.pick(topics),
            verb=chooser.pick(_VERBS),
            adj=chooser.pick(_ADJS),
            noun=chooser.pick(_NOUNS),
            noun2=chooser.pick(_NOUNS),
            adv=chooser.pick(_ADVS),
        )
        sentence = sentence[0].upper() + sentence[1:]
        sentences.append(sentence)
        length += count_tokens(" " + sentence)
    return " ".join(sentences)


def json_text(topic_text: str, schema: Mapping[str, Any] | None, sampling: Sampling) -> str:
    """A JSON document: valid against `schema` when given, else a small object about the topic."""
    base = sampling.base_rng()
    topics = topic_words(topic_text) or list(_GENERAL_TOPICS)
    if schema is not None:
        return json.dumps(SchemaValues(schema, topics, base).value())
    summary = answer_text(topic_text, sampling, 8, 16)
    return json.dumps({"topic": topics[0], "answer": summary, "confidence": 0.87})


@dataclass(frozen=True, slots=True)
class Cut:
    """Text cut by stop sequences and the token budget, as the engine would stop."""

    pieces: tuple[str, ...]
    finish_reason: str
    stop_reason: str | None


def cut(text: str, max_tokens: int | None, stop: Sequence[str]) -> Cut:
    stop_reason = None
    hits = [(text.find(s), s) for s in stop if s and s in text]
    if hits:
        position, stop_reason = min(hits)
        text = text[:position]
    pieces = tokenize(text)
    if max_tokens is not None and len(pieces) > max_tokens:
        return Cut(tuple(pieces[:max_tokens]), "length", None)
    return Cut(tuple(pieces), "stop", stop_reason)
