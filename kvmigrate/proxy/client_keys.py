"""Who is let in to the candidate when the proxy has no master key of its own.

In the pass-through mode the client's key is meant for the hosted primary, which checks it
on every call it answers. The self-hosted candidate never sees that key, so it cannot check
it: a request the rollout sends to the candidate (a split, a chain stored there) first has
its key verified by the primary, once, and the verdict is kept by the key's keyed hash for
a bounded time, as API gateways cache token introspection. A shadow copy goes out only
for a key the primary accepted. The key itself is never kept: only an HMAC of it under a
key this process draws at start and never writes anywhere.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

from aiohttp import web
from multidict import CIMultiDictProxy
from prometheus_client import Counter

from kvmigrate.config import Config
from kvmigrate.config.access import AuthMode, auth_mode
from kvmigrate.credential_names import is_credential_header
from kvmigrate.policies.outcome import refused_client
from kvmigrate.proxy.client import Response, UpstreamError
from kvmigrate.proxy.client_answer import ClientAnswer
from kvmigrate.proxy.errors import ProxyError
from kvmigrate.proxy.headers import HOP_BY_HOP, credential_query, relayed_response_headers
from kvmigrate.proxy.metrics import ProxyMetrics
from kvmigrate.proxy.upstream import Upstream

# Verdicts kept at most: each is a 32-byte hash and a few fields.
MAX_VERDICTS = 10_000
# What the question to the primary carries of the client's headers: its credentials, and
# what decides whether they are accepted (an OpenAI organisation or project; Anthropic's
# API wants its version on every call). Nothing else: the question is the proxy's own.
# Besides the credentials: Anthropic's API wants its version on every call.
ASKED_ALSO = ("anthropic-version",)
# The fingerprint of a request that carried no credential at all.
NO_CREDENTIALS = b""
# How often, at most, a primary that served a request with no credential is asked whether
# it is open to all.
OPEN_QUESTION_S = 60.0
# A refusal's body is read up to this, to be relayed to the client.
REFUSAL_BODY_LIMIT = 16 * 1024


@dataclass(frozen=True, slots=True)
class Verdict:
    """The primary's word on one key: accepted until `until`, or its refusal as it came
    (status, headers, body); neither (status 0): it could not say."""

    accepted: bool
    until: float
    status: int = 0
    headers: CIMultiDictProxy[str] | None = None
    body: bytes = b""


class KeyRefused(Exception):
    """The primary refused the client's key. The client gets that refusal as the primary
    gave it, with the headers of any answer the proxy relays from the primary: a keyless
    client cannot tell a conversation the candidate serves from one the primary serves."""

    def __init__(self, verdict: Verdict) -> None:
        super().__init__(f"the primary refused the key ({verdict.status})")
        self.verdict = verdict

    async def answer(
        self, request: web.Request, extra: list[tuple[str, str]]
    ) -> web.StreamResponse:
        verdict = self.verdict
        assert verdict.headers is not None
        client = ClientAnswer(
            request, verdict.status, relayed_response_headers(verdict.headers, extra)
        )
        await client.send_whole(verdict.body)
        return client


class KeyGate:
    """The verdicts of one proxy process on the client keys it passed through."""

    def __init__(self, config: Config, metrics: ProxyMetrics) -> None:
        self.mode = auth_mode(config)
        self.ttl = config.server.client_key_ttl_seconds
        self._hash_key = os.urandom(32)
        self._verdicts: OrderedDict[bytes, Verdict] = OrderedDict()
        self._asking: dict[bytes, asyncio.Future[Verdict]] = {}
        self._background: set[asyncio.Future[None]] = set()
        self._open_asked = 0.0  # when the primary may next be asked whether it is open
        self.checks = Counter(
            "kvmigrate_client_key_checks",
            "Passed-through client keys the primary was asked about, by verdict (accepted, "
            "refused, unknown: the primary did not say).",
            ["verdict"],
            registry=metrics.registry,
        )
        for verdict in ("accepted", "refused", "unknown"):
            self.checks.labels(verdict)

    @property
    def gating(self) -> bool:
        return self.mode is AuthMode.PASS_THROUGH

    def fingerprint(self, headers: CIMultiDictProxy[str], raw_query: str) -> bytes:
        """The keyed hash of every credential the primary receives of the client's (each
        header whose name may carry one, every value of one sent twice, in order, and the
        query's), so a verdict is kept for exactly what the primary was shown; an
        organisation or project header counts too. NO_CREDENTIALS when there is none."""
        sent = sorted(primary_credentials(headers), key=lambda item: item[0])
        query = credential_query(raw_query)
        if not sent and not query:
            return NO_CREDENTIALS
        mac = hmac.new(self._hash_key, digestmod=hashlib.sha256)
        for name, value in sent:
            mac.update(_exact(name) + b"\0" + _exact(value) + b"\1")
        mac.update(b"\2" + _exact(query))
        return mac.digest()

    def key_of(self, request: web.Request) -> bytes | None:
        """The client key's fingerprint where the primary vouches for keys, else None."""
        if not self.gating:
            return None
        return self.fingerprint(request.headers, request.rel_url.raw_query_string)

    async def check(
        self, request: web.Request, fingerprint: bytes | None, primary: Upstream
    ) -> KeyRefused | None:
        """Before a request goes to a backend other than the primary: None when it may
        (no gate, or a key the primary accepted), else the primary's refusal to answer
        with. Raises the 503 when the primary could not say."""
        if fingerprint is None or self.accepted(fingerprint):
            return None
        raw_query = request.rel_url.raw_query_string
        try:
            await self.admit(fingerprint, request.headers, raw_query, primary)
        except KeyRefused as refused:
            return refused
        return None

    def accepted(self, fingerprint: bytes | None) -> bool:
        """Whether a fresh verdict says the primary accepted this key. None: no gate."""
        if fingerprint is None:
            return True
        verdict = self._verdicts.get(fingerprint)
        return verdict is not None and verdict.accepted and verdict.until > time.monotonic()

    def ask_after_keyless_success(
        self, request: web.Request, fingerprint: bytes | None, status: int | None, primary: Upstream
    ) -> None:
        """The primary served a request that carried no credential. That vouches for
        nothing (it may admit by a header the proxy cannot read), but it is worth asking
        whether the primary is open to all: its model list asked without any credential,
        in the background. Open, later requests of the kind are shadowed too."""
        if fingerprint != NO_CREDENTIALS or status is None or not 200 <= status < 300:
            return
        now = time.monotonic()
        if self.accepted(fingerprint) or fingerprint in self._asking or now < self._open_asked:
            return
        self._open_asked = now + OPEN_QUESTION_S  # a closed primary is not asked every time
        raw_query = request.rel_url.raw_query_string
        asking = self.admit(fingerprint, request.headers, raw_query, primary)
        task = asyncio.ensure_future(asking)
        self._background.add(task)
        task.add_done_callback(self._settled)

    def _settled(self, task: asyncio.Future[None]) -> None:
        self._background.discard(task)
        if not task.cancelled():
            task.exception()  # a refusal or no answer: nothing opens, nothing to report

    def learn(self, fingerprint: bytes | None, status: int | None) -> None:
        """The primary's own answer to the client's request is a verdict too, when it is a
        success: only serving a request proves a key passed (a 400 can come from a front
        end that never looked at the key). A refusal drops an acceptance at once, so a
        revoked key stops reaching the candidate."""
        if fingerprint is None or status is None:
            return
        if refused_client(status):
            self._verdicts.pop(fingerprint, None)
        elif fingerprint == NO_CREDENTIALS:
            # No credential the proxy can see: the primary may admit by something else (a
            # header no name gives away, the proxy's own address), so only its explicit
            # answer to the check, without any credential, opens the candidate.
            return
        elif 200 <= status < 300 and not self.accepted(fingerprint):
            self._keep(fingerprint, Verdict(True, time.monotonic() + self.ttl))

    async def admit(
        self,
        fingerprint: bytes,
        headers: Mapping[str, str],
        raw_query: str,
        primary: Upstream,
    ) -> None:
        """Return once the primary accepted the key; raise KeyRefused (its refusal) or a
        503 (it could not say) otherwise. Concurrent requests with one new key wait for one
        question to the primary. A refusal is not kept: each request with a refused key
        costs the primary one call, as it would if the primary served it."""
        verdict = self._verdicts.get(fingerprint)
        if verdict is None or verdict.until <= time.monotonic():
            asking = self._asking.get(fingerprint)
            if asking is None:
                asking = asyncio.ensure_future(self._ask(fingerprint, headers, raw_query, primary))
                self._asking[fingerprint] = asking
                asking.add_done_callback(lambda _f: self._asking.pop(fingerprint, None))
            verdict = await asyncio.shield(asking)
        if verdict.accepted:
            return
        if verdict.status:
            raise KeyRefused(verdict)
        raise ProxyError(
            503,
            "The API key could not be verified: the primary API did not answer the check. "
            "Retry shortly.",
            "server_error",
            "key_verification_unavailable",
        )

    async def _ask(
        self, fingerprint: bytes, headers: Mapping[str, str], raw_query: str, primary: Upstream
    ) -> Verdict:
        """Ask the primary's cheapest authenticated call (its model list) with the client's
        credentials, as the primary itself would receive them."""
        url, _ = primary.probe()
        if query := credential_query(raw_query):
            url += ("&" if "?" in url else "?") + query
        sent = dict(primary_credentials(headers, ASKED_ALSO))
        sent["Accept-Encoding"] = "identity"
        try:
            async with asyncio.timeout(min(primary.config.read_timeout, 15.0)):
                response = await primary.send("GET", url, sent)
                try:
                    body = await _read_prefix(response, REFUSAL_BODY_LIMIT)
                    headers = response.headers
                finally:
                    response.close()
        except (TimeoutError, UpstreamError, OSError):
            self.checks.labels("unknown").inc()
            return Verdict(False, 0.0)
        status = response.status
        if 200 <= status < 300:
            verdict = Verdict(True, time.monotonic() + self.ttl)
        elif refused_client(status):
            self.checks.labels("refused").inc()
            return Verdict(False, 0.0, status, headers, body)
        else:  # a 404, a 429, a 5xx: no word on the key, and nothing kept
            self.checks.labels("unknown").inc()
            return Verdict(False, 0.0)
        self.checks.labels("accepted").inc()
        self._keep(fingerprint, verdict)
        return verdict

    def _keep(self, fingerprint: bytes, verdict: Verdict) -> None:
        self._verdicts[fingerprint] = verdict
        self._verdicts.move_to_end(fingerprint)
        while len(self._verdicts) > MAX_VERDICTS:
            self._verdicts.popitem(last=False)


def primary_credentials(
    headers: Mapping[str, str], also: tuple[str, ...] = ()
) -> list[tuple[str, str]]:
    """The client's headers the primary receives (not hop-by-hop, nor named in
    `Connection`) that may carry a credential, or are named in `also`, in order."""
    listed = {t.strip().lower() for t in headers.get("connection", "").split(",")}
    return [
        (lower, value)
        for name, value in headers.items()
        if (lower := name.lower()) not in HOP_BY_HOP
        and lower not in listed
        and (is_credential_header(lower) or lower in also)
    ]


def _exact(text: str) -> bytes:
    """Distinct strings to distinct bytes, undecodable header bytes included."""
    return text.encode("utf-8", "surrogatepass")


async def _read_prefix(response: Response, limit: int) -> bytes:
    """The answer's first `limit` bytes: a refusal is short, and a primary's model list
    (or anything else it sends) is not worth holding whole."""
    parts: list[bytes] = []
    size = 0
    while size < limit and (chunk := await response.readany()):
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts)[:limit]
