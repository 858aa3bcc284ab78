"""One `/admin` call over a real HTTP connection, as an operator's script makes it: its
status, body and Content-Type, whatever the status. The admin tests' one client."""

from __future__ import annotations

import urllib.error
import urllib.request


def admin_call(
    url: str,
    path: str,
    key: str | None,
    body: bytes | None = None,
    method: str | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> tuple[int, bytes, str]:
    """`key` as a bearer token with a JSON Content-Type, unless `headers` says what to send;
    GET without a body, POST with one, unless `method` says."""
    if headers is None:
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(
        url + path,
        data=body,
        method=method or ("GET" if body is None else "POST"),
        headers=headers,
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read(), response.headers["Content-Type"]
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read(), exc.headers["Content-Type"]
