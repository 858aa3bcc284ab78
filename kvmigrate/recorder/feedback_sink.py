"""Feedback into the records database: one row per score, written off the event loop.

Ids are keyed-hashed with the recorder's own key, as records keep conversation and answer
ids, so a score joins its conversation without naming anyone. The comment is treated as a
prompt is under the content policy: dropped under `none`, redacted under `redacted`, and
cut to a length under every policy.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

from kvmigrate.feedback.request import MAX_COMMENT_CHARS, Feedback
from kvmigrate.recorder.convert import stored_conversation
from kvmigrate.recorder.store import RecordStore, open_store
from kvmigrate.redaction import redact_text


def stored_comment(comment: str | None, content: str) -> str | None:
    if comment is None or content == "none":
        return None
    text = comment if content == "full" else redact_text(comment)
    return text[:MAX_COMMENT_CHARS]


class FeedbackSink:
    """Writes scores to the records database at `url` (opened on the first score)."""

    def __init__(self, url: str, content: str, hash_key: bytes, source: str) -> None:
        self.url = url
        self.content = content
        self._key = hash_key
        self.source = source
        self._store: RecordStore | None = None
        self._lock = threading.Lock()

    def row(self, feedback: Feedback, ts: float) -> tuple[object, ...]:
        def hashed(value: str | None) -> str | None:
            return None if value is None else stored_conversation(value, self.content, self._key)

        return (
            "fb-" + uuid.uuid4().hex,
            ts,
            hashed(feedback.conversation_id),
            hashed(feedback.response_id),
            feedback.name,
            feedback.value,
            stored_comment(feedback.comment, self.content),
        )

    def write(self, feedback: Feedback) -> str:
        """Store one score (blocking); returns its id."""
        row = (*self.row(feedback, time.time()), self.source)
        with self._lock:
            if self._store is None:
                self._store = open_store(self.url)
            store = self._store
        store.insert_feedback(row)
        return str(row[0])

    async def write_async(self, feedback: Feedback) -> str:
        return await asyncio.to_thread(self.write, feedback)

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None
