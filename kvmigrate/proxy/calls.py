"""What one client request becomes on its way upstream: the call to each backend (its URL,
headers and body) and the exchange that accounts for it."""

from __future__ import annotations

import os

from aiohttp import web

from kvmigrate.config import Config
from kvmigrate.config.access import AuthMode, auth_mode
from kvmigrate.proxy.body import with_model
from kvmigrate.proxy.chained import RESPONSES, ChainRouting
from kvmigrate.proxy.exchange import NOISE, SERVE, Exchange, Role
from kvmigrate.proxy.forward import Call
from kvmigrate.proxy.headers import (
    candidate_view,
    credential_query,
    upstream_headers,
    upstream_query,
)
from kvmigrate.proxy.routed import Routed
from kvmigrate.proxy.upstream import Upstreams


class Calls:
    """The calls and exchanges of one proxy: the client's request, routed, for each backend."""

    def __init__(self, config: Config, upstreams: Upstreams, chained: ChainRouting) -> None:
        self.config = config
        self.upstreams = upstreams
        self.chained = chained
        # The client's credentials are meant for the primary only in the pass-through mode:
        # with a master key they are the proxy's, and a primary with a key of its own
        # (the open mode) gets that key, not the client's cookies, organisation or query.
        self.passes_credentials = auth_mode(config) is AuthMode.PASS_THROUGH

    def model_call(self, request: web.Request, routed: Routed, backend: str) -> Call:
        """The call of a routed model request to `backend`, by that backend's model name."""
        served = routed.served[backend]
        return self.call(
            request,
            backend,
            routed.path,
            with_model(routed.body, served),
            primary=routed.route.is_primary(backend),
            conversation=routed.conversation,
            deployment=served,
        )

    def call(
        self,
        request: web.Request,
        backend: str,
        path: str,
        body: bytes,
        *,
        primary: bool,
        conversation: str = "",
        deployment: str | None = None,
        method: str | None = None,
    ) -> Call:
        """One upstream call for the client's request (`method`: another than the client's,
        for a read the proxy makes on its behalf). Only the primary may receive the client's
        own credentials, and only in the pass-through mode (no master key, and no key of
        the primary's own)."""
        upstream = self.upstreams[backend]
        passes = primary and self.passes_credentials
        headers = upstream_headers(
            request.headers
            if primary
            else candidate_view(request.headers, upstream.candidate_headers),
            upstream.auth,
            pass_client_credentials=passes,
        )
        url = upstream.url(path, conversation, deployment=deployment)
        # The raw (still percent-encoded) query: the decoded one turned `note=a%26b` into two
        # parameters, `note=a` and `b`, on the way upstream.
        raw_query = request.rel_url.raw_query_string
        if method is not None:  # a call of the proxy's own: the query's credentials alone
            raw_query = credential_query(raw_query)
        if query := upstream_query(raw_query, passes):
            url += ("&" if "?" in url else "?") + query
        return Call(method or request.method, url, body, headers)

    def exchange(
        self,
        routed: Routed | None,
        backend: str,
        role: Role,
        started: float,
        fallback_from: str | None = None,
    ) -> Exchange:
        """A new exchange with `backend`; `routed` None: a pass-through call, on no model
        route and in no conversation."""
        exchange = Exchange(
            request_id=new_request_id(),
            route=routed.path if routed else "other",
            backend=backend,
            role=role,
            model=routed.body.model if routed else "",
            served_model=routed.served[backend] if routed else "",
            conversation=routed.conversation if routed else "",
            turn=routed.turn if routed else 0,
            stream=routed.body.stream if routed else False,
            started=started,
            fallback_from=fallback_from,
        )
        if routed is not None:
            exchange.identity = routed.identity.source
            exchange.cohort = routed.cohort
            if role == SERVE:  # the answer the client gets is the one its next turn resends
                exchange.continuity = routed.identity.pending
            if routed.path == RESPONSES and role != NOISE:
                exchange.chain = self.chained.turn(
                    routed.conversation, routed.turn, routed.body, routed.chain
                )
        return exchange


def new_request_id() -> str:
    """The id the proxy gives an answer (`x-request-id`), and its records."""
    return "req_" + os.urandom(12).hex()
