"""A URL given to a command (`--base-url`, `--proxy-url`, `record.db`, a replica) may hold a
password or a key: no command prints it, in its output, its errors, its JSON or its logs."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from click.testing import CliRunner

from kvmigrate.cli import main
from kvmigrate.config import parse_config, safe_text
from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.proxy import build_proxy_app
from kvmigrate.recorder.store import StoreError, open_store
from kvmigrate.rollout.state import RolloutState
from kvmigrate.rollout.store import StoreError as RolloutStoreError
from kvmigrate.rollout.store import open_store as open_rollout_store
from kvmigrate.serving import BackgroundServer, free_port

PASSWORD = "hunter2-Zebra"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"  # the vllm emulator's


def _with_userinfo(url: str) -> str:
    return url.replace("http://", f"http://ops:{PASSWORD}@", 1)


@pytest.fixture(scope="module")
def vllm() -> Iterator[BackgroundServer]:
    with BackgroundServer(lambda: build_app(EmulatorSettings("vllm", time_scale=0.01))) as s:
        yield s


def _run(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.output  # stdout and stderr


def _stdout(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    assert PASSWORD not in result.output
    return result.stdout


def test_bench_never_shows_the_password_of_its_base_url(vllm: BackgroundServer) -> None:
    base = _with_userinfo(vllm.url) + "/v1"
    out = _stdout("bench", "--base-url", base, "--conversations", "1", "--turns", "1", "--json")
    run = json.loads(out)["run"]
    where = f"http://ops:***@{vllm.url.removeprefix('http://')}/v1"
    assert (run["base_url"], run["label"], run["errors"]) == (where, where, 0)


def test_bench_and_doctor_name_an_unreachable_url_without_its_password() -> None:
    base = f"http://ops:{PASSWORD}@127.0.0.1:{free_port()}/v1"
    for args in (
        ("bench", "--base-url", base, "--model", "m", "--conversations", "1", "--turns", "1"),
        ("doctor", "--base-url", base),
        ("doctor", "--base-url", base, "--json"),
    ):
        out = _run(*args)
        assert PASSWORD not in out, args
    assert "ops:***@127.0.0.1" in _run("doctor", "--base-url", base)


@pytest.mark.parametrize("base", [f"http://ops:{PASSWORD}/v1", f"ftp://ops:{PASSWORD}@h/v1"])
def test_a_malformed_base_url_is_refused_without_its_password(base: str) -> None:
    out = _run("bench", "--base-url", base)
    assert "Invalid value for '--base-url'" in out
    assert PASSWORD not in out


def test_doctor_reports_the_endpoint_without_its_password(vllm: BackgroundServer) -> None:
    out = _run("doctor", "--base-url", _with_userinfo(vllm.url) + "/v1", "--json")
    assert PASSWORD not in out
    assert f'"base_url": "http://ops:***@{vllm.url.removeprefix("http://")}/v1"' in out


def test_rollout_status_names_the_proxy_without_its_password() -> None:
    out = _run("rollout", "status", "--proxy-url", f"http://ops:{PASSWORD}@127.0.0.1:{free_port()}")
    assert "cannot reach the proxy at http://ops:***@127.0.0.1" in out
    assert PASSWORD not in out


@pytest.mark.parametrize(
    "url",
    [
        f"mysql://app:{PASSWORD}@db/kv",
        f"sqlite:/app:{PASSWORD}@x.db",
        f"redis://app:{PASSWORD}@cache:port/0",
    ],
)
def test_a_store_url_a_store_refuses_is_named_without_its_password(url: str) -> None:
    if not url.startswith("redis"):
        with pytest.raises(StoreError) as refused:
            open_store(url)
        assert PASSWORD not in str(refused.value)
        assert "***@" in str(refused.value)
    with pytest.raises(RolloutStoreError) as refused_too:
        open_rollout_store(url, RolloutState())
    assert PASSWORD not in str(refused_too.value)


def test_safe_text_hides_each_url_in_a_message() -> None:
    message = (
        f"GET http://ops:{PASSWORD}@gpu-1:8000/v1/models?api-key={PASSWORD}: refused. "
        f"also 'redis://:{PASSWORD}@cache/0'"
    )
    assert safe_text(message) == (
        "GET http://ops:***@gpu-1:8000/v1/models?api-key=***: refused. also 'redis://:***@cache/0'"
    )
    assert safe_text("no url here: a://") == "no url here: a://"


def test_a_replica_going_down_is_logged_without_its_password(
    vllm: BackgroundServer, caplog: pytest.LogCaptureFixture
) -> None:
    down = f"http://ops:{PASSWORD}@127.0.0.1:{free_port()}/v1"
    config = parse_config(
        f"""
backends:
  hosted: {{api_base: "{vllm.url}/v1"}}
  vllm: {{api_base: ["{down}", "{vllm.url}/v1"], connect_timeout: 1}}
models:
  - {{model_name: m, hosted: {MODEL}, vllm: {MODEL}}}
rollout: {{mode: split, percent: 100, fallback: true}}
""",
        env={},
    )
    caplog.set_level(logging.WARNING)
    with BackgroundServer(lambda: build_proxy_app(config)) as proxy:
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-x", max_retries=0)
        for n in range(4):  # conversations spread over both replicas: one meets the dead one
            client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": f"hi {n}"}],
                extra_headers={"X-Session-ID": f"s{n}"},
            )
        client.close()
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "replica http://ops:***@127.0.0.1" in logged
    assert PASSWORD not in logged


def test_records_prune_names_a_missing_database_without_its_password(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        'backends: {hosted: {api_base: "http://127.0.0.1:9/v1"}, vllm: {api_base: "http://127.0.0.1:8/v1"}}\n'
        f"record: {{db: 'sqlite:///{tmp_path}/none.db?password={PASSWORD}'}}\n"
    )
    out = _run("records", "prune", "--config", str(config))
    assert "no records database at" in out
    assert PASSWORD not in out
