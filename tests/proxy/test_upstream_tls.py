"""A hosted API is https. The proxy reaches it over TLS, verifies its certificate against the
system's trust store (SSL_CERT_FILE names another, as for any OpenSSL client), and answers
a client with the primary's error, not a crash, when the certificate is not trusted. Real
emulator behind TLS on loopback, the official openai SDK."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from proxy_support import HOSTED_MODEL, ProxyFactory
from tls_support import make_certificate, serving_context

from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.serving import BackgroundServer

MESSAGES = [{"role": "user", "content": "Name a river."}]


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_certificate(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def https_hosted(certificate: tuple[Path, Path]) -> Iterator[BackgroundServer]:
    server = BackgroundServer(
        lambda: build_app(EmulatorSettings(profile="hosted", time_scale=0)),
        tls=serving_context(*certificate),
    )
    with server:
        yield server


# `https_hosted` comes first so that it stops last: a TLS server stopped while the proxy still
# holds a connection to it waits for a close_notify that never comes, and leaks the socket.
def test_the_primary_over_https_streamed_and_not(
    https_hosted: BackgroundServer,
    make_proxy: ProxyFactory,
    certificate: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate[0]))
    assert https_hosted.url.startswith("https://127.0.0.1:")
    proxy = make_proxy(rollout="{mode: split, percent: 0}", hosted_url=https_hosted.url)
    answer = proxy.client().chat.completions.create(model=HOSTED_MODEL, messages=MESSAGES)
    assert answer.choices[0].message.content
    stream = proxy.client().chat.completions.create(
        model=HOSTED_MODEL, messages=MESSAGES, stream=True
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text


def test_an_untrusted_certificate_is_a_clear_502(
    https_hosted: BackgroundServer, make_proxy: ProxyFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    proxy = make_proxy(rollout="{mode: split, percent: 0}", hosted_url=https_hosted.url)
    with pytest.raises(openai.APIStatusError) as raised:
        proxy.client().chat.completions.create(model=HOSTED_MODEL, messages=MESSAGES)
    assert raised.value.status_code == 502
    assert "hosted" in raised.value.message
