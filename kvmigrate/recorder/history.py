"""A conversation's history, stored once: each message of a recorded request goes into the
`messages` table, keyed by the digest of its stored (redacted) JSON, and the record lists
the digests in `request_messages`.

An agent resends its whole history every turn, so storing every request whole grows with
the square of the conversation: 30 turns over a 10K-token history is about 1.2 MB for one
conversation, written, redacted and indexed again each turn. Stored once, each turn costs
its new messages plus a list of digests. The converter remembers the messages it has
already stored, so an unchanged history is neither redacted nor written again.

`request_json` then holds the request without its history key (`messages` for chat,
`input` for the Responses API); `inflate` puts it back. A message row's `last_seen` is
refreshed at most every `TOUCH_S` per proxy, which is what lets `prune` delete the
messages that no kept record can still reference.
"""

from __future__ import annotations

import base64
import hashlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Generic, NamedTuple, TypeVar

import msgspec
import orjson

from kvmigrate.recorder.record import MessageRow
from kvmigrate.recorder.store import RecordStore

# Where each route keeps the history that repeats from turn to turn.
HISTORY_KEYS = {"chat/completions": "messages", "responses": "input", "messages": "messages"}
TOUCH_S = 3600.0
_LOOKUP_CHUNK = 500  # digests per SELECT ... IN (...): well under every driver's limit
# A body's members and an array's elements, as raw JSON: checked, but not built into objects.
_OBJECT = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ARRAY = msgspec.json.Decoder(list[msgspec.Raw])
_INVALID = (msgspec.DecodeError, msgspec.ValidationError)

Encode = Callable[[Any], bytes]
K = TypeVar("K")
V = TypeVar("V")


class SplitRequest(NamedTuple):
    rest: bytes  # the request without its history key, as stored (encoded)
    refs: str | None  # `request_messages`: {"<key>": [digest, ...]}, as JSON
    new: list[MessageRow]  # messages not stored before
    touched: list[str]  # stored messages whose `last_seen` is due for a refresh


class HistoryMemo:
    """The messages this converter has stored, by their raw JSON as the client sent them:
    a hit costs a dict lookup instead of a parse, a redaction walk and a row. Bounded by
    bytes, LRU."""

    def __init__(self, max_bytes: int = 64 << 20) -> None:
        self._seen: SizedLru[bytes, list[Any]] = SizedLru(max_bytes)  # raw: [digest, touched]
        # Half as much again for each conversation's last history (the shortcut below).
        self._prefixes = _Prefixes(max_bytes // 2)
        # The rest of a request repeats too (model, parameters, and the `tools` schemas,
        # often kilobytes): stored once encoded, it is not parsed and redacted again.
        self._rests = _Encoded(max_bytes // 8)

    def forget(self) -> None:
        """After a failed write: what this memo vouches for may not be in the database."""
        self._seen.clear()
        self._prefixes.clear()

    def split(
        self, route: str, body: bytes, ts: float, encode: Encode, conversation: str = ""
    ) -> SplitRequest | None:
        """The request body split into its history and the rest; None when it is not a
        JSON object. Only the members are parsed, and of the history only the messages
        not seen before: a long history costs a scan, not a parse and a redaction. When
        the history starts with the conversation's previous one, byte for byte, only the
        messages after it are even looked at."""
        try:
            return self._split(route, _OBJECT.decode(body), ts, encode, conversation)
        except (*_INVALID, orjson.JSONDecodeError):
            return None  # msgspec and orjson disagree at the edges (huge numbers, ...)

    def _split(
        self,
        route: str,
        members: dict[str, msgspec.Raw],
        ts: float,
        encode: Encode,
        conversation: str,
    ) -> SplitRequest:
        key = HISTORY_KEYS.get(route)
        array = bytes(members[key]) if key in members else b""
        matched = self._prefixes.match(conversation, array, ts) if conversation else None
        digests, items = matched if matched is not None else ([], _items(array))
        rest = self._rests.encoded(
            tuple((k, bytes(v)) for k, v in members.items() if k != key or not (items or digests)),
            encode,
        )
        if key is None or items is None or not (items or digests):
            return SplitRequest(rest, None, [], [])
        new: list[MessageRow] = []
        touched: list[str] = []
        for item in items:
            raw = bytes(item)
            known = self._seen.get(raw)
            if known is None:
                stored = encode(orjson.loads(raw))
                digest = message_digest(stored)
                new.append(MessageRow(digest, ts, stored.decode()))
                self._seen.put(raw, [digest, ts], len(raw))
            else:
                digest = known[0]
                if ts - known[1] > TOUCH_S:
                    known[1] = ts
                    touched.append(digest)
            digests.append(digest)
        if conversation:
            self._prefixes.keep(conversation, array, digests, ts, reused=matched is not None)
        return SplitRequest(rest, orjson.dumps({key: digests}).decode(), new, touched)


class SizedLru(Generic[K, V]):
    """A mapping bounded by the total size its entries are given, least recently used out
    first; an entry bigger than the bound is not kept. The memos here all take this form."""

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        self.size = 0
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def pop(self, key: K) -> V | None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        self.size -= entry[1]
        return entry[0]

    def put(self, key: K, value: V, size: int) -> None:
        self.pop(key)
        if size > self.max_size:
            return
        self._entries[key] = (value, size)
        self.size += size
        while self.size > self.max_size:
            _, (_, evicted) = self._entries.popitem(last=False)
            self.size -= evicted

    def clear(self) -> None:
        self._entries.clear()
        self.size = 0


class _Encoded:
    """JSON objects as stored, by their members as sent (name, raw JSON)."""

    def __init__(self, max_bytes: int) -> None:
        self._by_members: SizedLru[tuple[tuple[str, bytes], ...], bytes] = SizedLru(max_bytes)

    def encoded(self, members: tuple[tuple[str, bytes], ...], encode: Encode) -> bytes:
        done = self._by_members.get(members)
        if done is None:
            done = encode({name: orjson.loads(raw) for name, raw in members})
            size = len(done) + sum(len(raw) for _, raw in members)
            self._by_members.put(members, done, size)
        return done


def _items(raw: bytes) -> list[msgspec.Raw] | None:
    """The elements of a JSON array, unparsed; None for anything else."""
    if not raw:
        return None
    try:
        return _ARRAY.decode(raw)
    except _INVALID:
        return None


class _Prefix(NamedTuple):
    head: bytes  # the history array as sent, less its closing `]`: ends with an element
    digests: list[str]
    ts: float  # when its messages' `last_seen` was last checked


class _Prefixes:
    """Each conversation's last history, as bytes. An agent's next request starts with it
    byte for byte, so one comparison vouches for every message in it; only what follows
    is decoded. Bounded by bytes, LRU; entries older than TOUCH_S are not used, so that
    the messages' `last_seen` is refreshed on the per-message path."""

    def __init__(self, max_bytes: int) -> None:
        self._by_conversation: SizedLru[str, _Prefix] = SizedLru(max_bytes)

    def clear(self) -> None:
        self._by_conversation.clear()

    def match(
        self, conversation: str, array: bytes, ts: float
    ) -> tuple[list[str], list[msgspec.Raw] | None] | None:
        """(digests of the known messages, the messages after them) or None."""
        prefix = self._by_conversation.get(conversation)
        if prefix is None or ts - prefix.ts > TOUCH_S or not array.startswith(prefix.head):
            return None
        # Parsing "[e1,...,en" is settled whatever follows; the next byte says what does.
        tail = array[len(prefix.head) :].lstrip()
        if tail.startswith(b"]"):
            return list(prefix.digests), []
        if not tail.startswith(b","):
            return None
        return list(prefix.digests), _items(b"[" + tail[1:])

    def keep(
        self, conversation: str, array: bytes, digests: list[str], ts: float, reused: bool
    ) -> None:
        """Remember `array` for the conversation's next request. `reused`: its messages
        came from the last prefix, unchecked, so its age carries over; otherwise they all
        went through the per-message path just now (touches included) and it starts anew."""
        head = array.rstrip()
        if not head.endswith(b"]") or not digests:
            return
        old = self._by_conversation.pop(conversation)
        if old is not None and reused:
            ts = old.ts
        prefix = _Prefix(head[:-1].rstrip(), digests, ts)
        self._by_conversation.put(conversation, prefix, len(prefix.head))


def message_digest(body: bytes) -> str:
    """96 bits of BLAKE2b in 16 URL-safe characters: a history of 50 messages lists 0.9 KB
    of digests per record."""
    return base64.urlsafe_b64encode(hashlib.blake2b(body, digest_size=12).digest()).decode()


def inflate_rows(
    store: RecordStore, rows: Sequence[tuple[str | None, str | None]]
) -> list[dict[str, Any] | None]:
    """Whole request bodies for (request_json, request_messages) rows; None where a row has
    no stored request, or names a message that is gone (a write that failed mid-way)."""
    wanted: set[str] = set()
    parsed: list[tuple[dict[str, Any], dict[str, list[str]]] | None] = []
    for request_json, refs_json in rows:
        if request_json is None:
            parsed.append(None)
            continue
        refs = orjson.loads(refs_json) if refs_json else {}
        parsed.append((orjson.loads(request_json), refs))
        for digests in refs.values():
            wanted.update(digests)
    bodies = message_bodies(store, wanted)
    return [None if item is None else _inflate(*item, bodies) for item in parsed]


def _inflate(
    body: dict[str, Any], refs: dict[str, list[str]], bodies: dict[str, Any]
) -> dict[str, Any] | None:
    for key, digests in refs.items():
        if not all(d in bodies for d in digests):
            return None
        body[key] = [bodies[d] for d in digests]
    return body


def message_bodies(store: RecordStore, digests: Iterable[str]) -> dict[str, Any]:
    wanted = sorted(set(digests))
    found: dict[str, Any] = {}
    for start in range(0, len(wanted), _LOOKUP_CHUNK):
        chunk = wanted[start : start + _LOOKUP_CHUNK]
        marks = ", ".join("?" for _ in chunk)
        sql = f"SELECT digest, body FROM messages WHERE digest IN ({marks})"
        for digest, body in store.query(sql, chunk):
            found[digest] = orjson.loads(body)
    return found
