"""What a window of recorded traffic says about one backend: the input of every gate."""

from __future__ import annotations

from dataclasses import dataclass

# The most raw TTFT (and latency) values a window keeps: a uniform sample of them when there
# are more, enough for a p95 interval a few milliseconds wide.
RESERVOIR = 4000


@dataclass(frozen=True, slots=True)
class ComparatorCounts:
    """One parity comparator over a window: scored candidate pairs it applied to and
    disagreed on, and the same for the primary-vs-primary (noise) pairs."""

    name: str
    candidate_n: int
    candidate_disagree: int
    noise_n: int
    noise_disagree: int


@dataclass(frozen=True, slots=True)
class BackendWindow:
    """Figures for one backend over a time window, from the recorder (or a live counter).

    `requests` counts upstream calls that reached a verdict (any status, or a transport
    error); `errors` counts what `policies.outcome.is_backend_error` says: transport errors,
    5xx and 429 answers, clients that gave up before the first byte, and a candidate's
    copy refused with a 4xx its primary did not give (`rejected`); any other 4xx is the
    client's fault, and counted neither way for gates. TTFT figures are in seconds, of
    answers that did not fail with an error status, and None when none had one. `parity`
    is the noise-adjusted agreement in [0, 1] once the parity engine scores pairs, else
    None. `tool_calls` / `invalid_tool_calls`: calls in the backend's answers, and those
    naming an unoffered tool or with broken arguments.
    `latency_p95`: total latency, what the TTFT gate compares when nothing was streamed (a
    non-streamed answer has no observable TTFT).
    `noise_pairs` / `noise_needed`: primary-vs-primary pairs in the window, and how many a
    noise floor needs (parity stays None below it). `span_s`: the seconds between the
    window's first and last record, so a waiting gate can say how long it has to go.
    `ttft_sample` / `latency_sample`: the raw values in seconds (all of them, or a uniform
    sample of RESERVOIR), for the interval on the p95; `tps_sample`: each stream's output
    tokens per second after its first token (`policies.decode_speed`). `comparators`:
    per-comparator parity counts, for the interval of each.
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
    ttft_sample: tuple[float, ...] = ()
    latency_sample: tuple[float, ...] = ()
    tps_sample: tuple[float, ...] = ()  # decode tokens per second, one per stream
    comparators: tuple[ComparatorCounts, ...] = ()

    @property
    def error_rate(self) -> float:
        return rate_of(self.errors, self.requests)


def rate_of(count: int, requests: int) -> float:
    """`count` per request; 0 with no requests. A function of its own, not the property's
    body: mutmut cannot mutate a property (scripts/mutation.sh)."""
    return count / requests if requests else 0.0
