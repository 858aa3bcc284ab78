"""A labelled set of pairs for the quality bar: noise-only pairs and injected divergences.

Noise pairs are two calls, without a seed, to one emulated backend whose `noise` knob makes
unseeded calls vary like samples of a real model. Each call names the seed of that variation
(`x-emulator-noise-seed`, drawn from the set's own seed), so a set is the same on every run:
a threshold tested over many runs is tested, not sampled. Each divergence takes such a pair and
changes the second answer in one known way: a wrong tool name, a wrong argument value,
broken JSON, a truncated answer, a refusal, or an answer on another topic. The parity
engine should flag every divergence and (almost) no noise pair. Used by
tests/parity/test_parity_quality.py and benchmarks/parity_quality.py.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvmigrate.emulator.parsing import NOISE_SEED_HEADER
from kvmigrate.parity.answer import Outcome, read_outcome
from kvmigrate.parity.compare import compare
from kvmigrate.parity.settings import ParitySettings

JSON = dict[str, Any]
NOISE = "noise"
DIVERGENCES = (
    "wrong_tool_name",
    "wrong_argument",
    "broken_json",
    "truncated",
    "refusal",
    "different_topic",
)
ROUTE = "chat/completions"
_NOUN_TEXT = (
    "volcanoes glaciers photosynthesis kubernetes sourdough origami bicycles espresso "
    "submarines telescopes vaccines beekeeping chess jazz marathons lighthouses compost "
    "satellites tectonics mushrooms typography sailing pottery falconry cryptography "
    "orchestras windmills skyscrapers archery tides"
)
_NOUNS = tuple(_NOUN_TEXT.split())
_ASPECT_TEXT = "history economics safety future physics culture maintenance design"
_ASPECTS = tuple(_ASPECT_TEXT.split())
_OTHER_TOPICS = (
    "quantum entanglement in superconducting qubits",
    "medieval cathedral acoustics and choirs",
    "migratory routes of arctic terns",
    "tax treatment of municipal bonds",
    "fermentation of korean kimchi",
)
_CITIES = ("Paris", "Lisbon", "Nairobi", "Osaka", "Denver", "Oslo", "Lima", "Hanoi")
_REFUSALS = (
    "I'm sorry, but I can't help with that.",
    "I'm sorry, I can't assist with that request.",
    "I cannot help with this request because it may violate the usage policies.",
    "Unfortunately, I am unable to provide that information.",
    "As an AI language model, I cannot provide advice on this.",
)
TOOLS: list[JSON] = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city",
        "parameters": {"type": "object", "required": ["city", "unit"], "properties": {
            "city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}}}},
    {"type": "function", "function": {
        "name": "search_docs", "description": "Search the documentation for a query",
        "parameters": {"type": "object", "required": ["query", "limit"], "properties": {
            "query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1,
                                                   "maximum": 20}}}}},
    {"type": "function", "function": {
        "name": "create_ticket", "description": "Create a support ticket with a priority",
        "parameters": {"type": "object", "required": ["title", "priority"], "properties": {
            "title": {"type": "string"},
            "priority": {"type": "string", "enum": ["low", "medium", "high"]}}}}},
]  # fmt: skip
SCHEMA: JSON = {
    "type": "object",
    "required": ["title", "tags", "score"],
    "properties": {
        "title": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "score": {"type": "integer", "minimum": 1, "maximum": 10},
    },
    "additionalProperties": False,
}
# POST a chat request, with the seed of the emulator's noise for this call.
Post = Callable[[JSON, int], tuple[int | None, bytes]]


@dataclass(frozen=True, slots=True)
class LabelledPair:
    label: str  # NOISE or one of DIVERGENCES
    request: JSON
    primary: Outcome
    candidate: Outcome


def http_poster(base_url: str, timeout: float = 10.0) -> Post:
    """POST a chat request to `base_url` (ending in /v1); (status, body), status None when
    the call failed outright."""

    def post(body: JSON, noise_seed: int) -> tuple[int | None, bytes]:
        request = urllib.request.Request(
            base_url.rstrip("/") + "/chat/completions",
            data=json.dumps(body).encode(),
            headers={
                "Content-Type": "application/json",
                "Authorization": "Bearer test",
                NOISE_SEED_HEADER: str(noise_seed),
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()
        except OSError:
            return None, b""

    return post


def _chat(model: str, text: str, rng: random.Random, **extra: Any) -> JSON:
    body: JSON = {"model": model, "messages": [{"role": "user", "content": text}], **extra}
    body["temperature"] = round(rng.uniform(0.6, 1.2), 2)
    if rng.random() < 0.5:
        body["stream"] = True
    return body


def text_request(model: str, rng: random.Random) -> JSON:
    noun, aspect = rng.choice(_NOUNS), rng.choice(_ASPECTS)
    phrasing = rng.choice(
        (
            f"Explain the {aspect} of {noun}.",
            f"What should a beginner know about {noun} and their {aspect}?",
            f"Give me an overview of {noun} {aspect}.",
        )
    )
    return _chat(model, phrasing, rng)


def tool_request(model: str, rng: random.Random) -> JSON:
    city, noun = rng.choice(_CITIES), rng.choice(_NOUNS)
    text = rng.choice(
        (
            f"What is the weather in {city} right now?",
            f"Search the documentation for {noun} configuration.",
            f"Create a ticket: {noun} dashboard is down in {city}.",
        )
    )
    return _chat(model, text, rng, tools=TOOLS, tool_choice="required")


def json_request(model: str, rng: random.Random) -> JSON:
    noun = rng.choice(_NOUNS)
    if rng.random() < 0.5:
        fmt: JSON = {"type": "json_schema", "json_schema": {"name": "card", "schema": SCHEMA}}
    else:
        fmt = {"type": "json_object"}
    return _chat(model, f"Describe {noun} as a JSON card.", rng, response_format=fmt)


def _call(post: Post, body: JSON, rng: random.Random) -> Outcome:
    status, raw = post(body, rng.getrandbits(63))
    return read_outcome(ROUTE, raw, status)


def noise_pair(post: Post, request: JSON, rng: random.Random) -> LabelledPair:
    primary = _call(post, request, rng)
    return LabelledPair(NOISE, request, primary, _call(post, request, rng))


def _message(outcome: Outcome) -> JSON:
    response = copy.deepcopy(outcome.response or {})
    return response


def _with(outcome: Outcome, edit: Callable[[JSON], None]) -> Outcome:
    """The outcome with its response edited (a deep copy; the original stays intact)."""
    response = _message(outcome)
    edit(response["choices"][0])
    return dataclasses.replace(outcome, response=response)


def _first_call(choice: JSON) -> JSON:
    call: JSON = choice["message"]["tool_calls"][0]
    return call


def wrong_tool_name(choice: JSON, rng: random.Random) -> None:
    call = _first_call(choice)
    names = [
        t["function"]["name"] for t in TOOLS if t["function"]["name"] != call["function"]["name"]
    ]
    call["function"]["name"] = rng.choice(names)


def wrong_argument(choice: JSON, rng: random.Random) -> None:
    call = _first_call(choice)
    arguments = json.loads(call["function"]["arguments"])
    key = rng.choice(sorted(arguments))
    value = arguments[key]
    if isinstance(value, bool):
        arguments[key] = not value
    elif isinstance(value, int | float):
        arguments[key] = value + rng.randint(1, 5)
    elif value in ("c", "f", "low", "medium", "high"):
        arguments[key] = {"c": "f", "f": "c", "low": "high", "medium": "low", "high": "low"}[value]
    else:
        arguments[key] = rng.choice([c for c in _CITIES if c != value])
    call["function"]["arguments"] = json.dumps(arguments)


def broken_json(choice: JSON, rng: random.Random) -> None:
    message = choice["message"]
    if message.get("tool_calls"):
        call = _first_call(choice)
        call["function"]["arguments"] = call["function"]["arguments"].rstrip("}")
        return
    text = message["content"]
    cut = rng.choice(("drop_close", "unquote", "trailing_comma"))
    if cut == "drop_close":
        message["content"] = text.rstrip().rstrip("}")
    elif cut == "unquote":
        message["content"] = text.replace('"', "", 2)
    else:
        message["content"] = text.rstrip().rstrip("}") + ",}"


def truncated(choice: JSON, rng: random.Random) -> None:
    message = choice["message"]
    words = message["content"].split(" ")
    keep = max(1, int(len(words) * rng.uniform(0.3, 0.7)))
    # A token budget cuts mid-sentence; a cut that happens to land on a sentence end is
    # just a shorter answer, so move it one word on.
    while keep < len(words) - 1 and words[keep - 1].endswith((".", "!", "?")):
        keep += 1
    message["content"] = " ".join(words[:keep])
    if rng.random() < 2 / 3:
        choice["finish_reason"] = "length"


def refusal(choice: JSON, rng: random.Random) -> None:
    message = choice["message"]
    phrase = rng.choice(_REFUSALS)
    if rng.random() < 1 / 3:
        message["content"], message["refusal"] = None, phrase
    else:
        message["content"] = phrase


def divergent_pair(post: Post, label: str, request: JSON, rng: random.Random) -> LabelledPair:
    pair = noise_pair(post, request, rng)
    if label == "different_topic":
        other = {**request, "messages": [{"role": "user", "content": rng.choice(_OTHER_TOPICS)}]}
        return LabelledPair(label, request, pair.primary, _call(post, other, rng))
    mutate = {
        "wrong_tool_name": wrong_tool_name,
        "wrong_argument": wrong_argument,
        "broken_json": broken_json,
        "truncated": truncated,
        "refusal": refusal,
    }[label]
    return LabelledPair(
        label, request, pair.primary, _with(pair.candidate, lambda c: mutate(c, rng))
    )


def _request_for(label: str, model: str, rng: random.Random, index: int) -> JSON:
    if label in ("wrong_tool_name", "wrong_argument"):
        return tool_request(model, rng)
    if label == "broken_json":
        return json_request(model, rng) if index % 3 else tool_request(model, rng)
    if label == NOISE:
        return (text_request, text_request, tool_request, json_request)[index % 4](model, rng)
    return text_request(model, rng)


def build_labelled_set(
    post: Post, model: str, *, per_class: int = 40, noise_pairs: int = 200, seed: int = 0
) -> list[LabelledPair]:
    """`noise_pairs` noise-only pairs (text, tool and JSON requests) and `per_class`
    pairs of each divergence, all answered by the backend behind `post`."""
    rng = random.Random(seed)
    pairs = [noise_pair(post, _request_for(NOISE, model, rng, i), rng) for i in range(noise_pairs)]
    for label in DIVERGENCES:
        for index in range(per_class):
            request = _request_for(label, model, rng, index)
            pairs.append(divergent_pair(post, label, request, rng))
    return pairs


@dataclass(frozen=True, slots=True)
class QualityFigures:
    """detection: per divergence class, the share flagged; false_alarm_rate: the share of
    noise pairs flagged. misses / false_alarms: (label, disagreeing comparators, detail)."""

    detection: dict[str, float]
    counts: dict[str, int]
    detection_rate: float
    false_alarm_rate: float
    misses: list[tuple[str, str]]
    false_alarms: list[tuple[str, str]]


def measure_quality(
    pairs: Sequence[LabelledPair], settings: ParitySettings | None = None
) -> QualityFigures:
    flagged: dict[str, int] = {}
    counts: dict[str, int] = {}
    misses: list[tuple[str, str]] = []
    alarms: list[tuple[str, str]] = []
    for pair in pairs:
        score = compare(
            pair.request, pair.primary, pair.candidate, settings=settings or ParitySettings()
        )
        counts[pair.label] = counts.get(pair.label, 0) + 1
        hit = not score.agree
        flagged[pair.label] = flagged.get(pair.label, 0) + hit
        summary = "; ".join(f"{r.name}: {r.detail}" for r in score.results if not r.agree)
        if pair.label == NOISE and hit:
            alarms.append((pair.label, summary))
        elif pair.label != NOISE and not hit:
            misses.append((pair.label, json.dumps(score.to_dict())[:400]))
    divergent = [label for label in counts if label != NOISE]
    detection = {label: flagged[label] / counts[label] for label in divergent}
    total = sum(counts[label] for label in divergent)
    return QualityFigures(
        detection=detection,
        counts=counts,
        detection_rate=sum(flagged[label] for label in divergent) / total if total else 0.0,
        false_alarm_rate=flagged.get(NOISE, 0) / counts[NOISE] if counts.get(NOISE) else 0.0,
        misses=misses,
        false_alarms=alarms,
    )
