"""What a window of recorded traffic says about one backend: the input of every gate."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BackendWindow:
    """Figures for one backend over a time window, from the recorder (or a live counter).

    `requests` counts upstream calls that reached a verdict (any status, or a transport
    error); `errors` counts what `policies.outcome.is_backend_error` says: transport errors,
    5xx and 429 answers, and clients that gave up before the first byte (any other 4xx is
    the client's fault, and counted neither way for gates). TTFT figures are in seconds and
    None when no request of the window had one. `parity` is the noise-adjusted agreement in
    [0, 1] once the parity engine scores pairs, else None. `tool_calls` /
    `invalid_tool_calls`: calls in the backend's answers, and those naming an unoffered tool
    or with broken arguments.
    `latency_p95`: total latency, what the TTFT gate compares when nothing was streamed (a
    non-streamed answer has no observable TTFT).
    `noise_pairs` / `noise_needed`: primary-vs-primary pairs in the window, and how many a
    noise floor needs (parity stays None below it). `span_s`: the seconds between the
    window's first and last record, so a waiting gate can say how long it has to go.
    """

    backend: str
    requests: int = 0
    conversations: int = 0
    errors: int = 0
    ttft_p50: float | None = None
    ttft_p95: float | None = None
    parity: float | None = None
    parity_samples: int = 0
    tool_calls: int = 0
    invalid_tool_calls: int = 0
    latency_p95: float | None = None
    noise_pairs: int = 0
    noise_needed: int = 0
    span_s: float = 0.0

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0
