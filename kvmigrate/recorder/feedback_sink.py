"""Feedback into the records database: one row per score, written off the event loop.

Ids are keyed-hashed with the recorder's own key, as records keep conversation and answer
ids, so a score joins its conversation without naming anyone. The comment is treated as a
prompt is under the content policy: dropped under `none`, redacted under `redacted`, and
cut to a length under every policy.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from kvmigrate.feedback.request import MAX_COMMENT_CHARS, Feedback, FeedbackUnavailable
from kvmigrate.recorder.convert import stored_conversation
from kvmigrate.recorder.store import RecordStore, database_errors, open_store
from kvmigrate.redaction import redact_text

log = logging.getLogger("kvmigrate.recorder")

# Scores waiting for the database beyond this are refused (503), not queued: a locked or
# slow database must cost a feedback client a retry, never the proxy its memory. A score
# that waited longer than MAX_QUEUE_WAIT_S behind another is refused without trying, so a
# database holding each write for its busy timeout answers every client within about that.
MAX_PENDING = 32
MAX_QUEUE_WAIT_S = 2.0


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
        # A thread of its own: a database waiting on a lock (up to its busy timeout) must not
        # hold the loop's shared threads, which inflate bodies and read rollout state.
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="kvmigrate-feedback")
        self._pending = 0

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
        """Store one score on the sink's own thread; FeedbackUnavailable when the database
        fails or too many scores already wait for it."""
        if self._pending >= MAX_PENDING:
            raise FeedbackUnavailable("scores are waiting for the records database")
        self._pending += 1
        try:
            loop = asyncio.get_running_loop()
            queued = time.monotonic()
            return await loop.run_in_executor(self._writer, self._write_fresh, feedback, queued)
        except database_errors() as exc:
            # The class only: a driver's message may quote the database URL.
            log.warning("feedback: the records database refused a score (%s)", type(exc).__name__)
            raise FeedbackUnavailable(type(exc).__name__) from None
        finally:
            self._pending -= 1

    def _write_fresh(self, feedback: Feedback, queued: float) -> str:
        if time.monotonic() - queued > MAX_QUEUE_WAIT_S:
            raise FeedbackUnavailable("waited too long behind other scores")
        return self.write(feedback)

    def close(self) -> None:
        self._writer.shutdown(wait=True)
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None
