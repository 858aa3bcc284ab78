"""OpenAI wire formats read back: SSE streams reassembled into the non-streamed shape.

Shared by the recorder, the parity engine and the cache-buster detector, so it depends on
none of them.
"""
