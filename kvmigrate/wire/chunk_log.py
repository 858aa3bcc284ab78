"""What one exchange keeps of an answer for the recorder: a bounded log of its chunks.

Here, not in the proxy package, because the recorder's and the detector's workers read the
bound too, and importing `kvmigrate.proxy` would load the whole server into them.
"""

from __future__ import annotations

# What one exchange keeps of an answer for the recorder; the client gets every byte anyway.
MAX_RECORDED_BYTES = 8 * 1024 * 1024
_TAIL_CHUNKS = 8  # the last chunks are kept too: a stream's usage event comes last


class ChunkLog(list[bytes]):
    """The answer's chunks as relayed, up to `MAX_RECORDED_BYTES`, and then only the last
    few: a 200 MB answer must not sit in the proxy's memory (and again in the recorder's)
    only to be recorded. `dropped` counts the bytes not kept."""

    __slots__ = ("_head", "_kept", "dropped")

    def __init__(self) -> None:
        super().__init__()
        self.dropped = 0
        self._head = 0
        self._kept = 0

    @property
    def size(self) -> int:
        """The bytes logged so far, less the last few chunks after the head filled up."""
        return self._kept + self.dropped

    def head(self) -> list[bytes]:
        """The chunks before the gap where chunks were dropped (all of them, if none was).
        Joined with the tail, they meet mid-line: what reads events reads the head alone."""
        return self[: self._head] if self.dropped else self[:]

    def append(self, chunk: bytes) -> None:
        if self._kept < MAX_RECORDED_BYTES:
            self._kept += len(chunk)
            super().append(chunk)
            self._head = len(self)
            return
        super().append(chunk)
        if len(self) - self._head > _TAIL_CHUNKS:
            self.dropped += len(self.pop(self._head))
