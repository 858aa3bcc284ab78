"""The embedded default: an emulated hosted API and an emulated vLLM, with the proxy in front.

It needs no GPU and no keys, so a new user can see the whole flow in one command, and the
demo, the docs and the tests all start from the same setup.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import yaml

from kvmigrate.config import Config, parse_config
from kvmigrate.emulator import EmulatorSettings, Profile, build_app
from kvmigrate.emulator.dcgm import PATH as DCGM_PATH
from kvmigrate.serving import BackgroundServer
from kvmigrate.vendor_internals.libc import set_parent_death_signal

HOSTED_MODEL = "gpt-4o-mini"
CLAUDE_MODEL = "claude-sonnet-4-5"  # the hosted model with `api="anthropic"`
VLLM_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
EMBEDDING_MODEL = "text-embedding-3-small"
# Only ever used on loopback by the emulated setup, so a user can try the admin API.
EMBEDDED_ADMIN_KEY = "kvmigrate-emulated-admin"


@dataclass(frozen=True, slots=True)
class EmulatedBackends:
    hosted_url: str
    vllm_url: str


@contextmanager
def emulated_backends(
    time_scale: float = 1.0,
    broken_tool_calls: float = 0.0,
    api: str = "openai",
    own_process: bool = False,
) -> Iterator[EmulatedBackends]:
    """Start both emulators on free loopback ports for as long as the block runs. They
    answer alike (one answer family) up to sampling noise, as a good candidate would;
    `broken_tool_calls` makes the candidate's tool calls come out broken. `api="anthropic"`:
    the hosted side is Anthropic's API (the vLLM side serves its /v1/messages anyway).
    `own_process`: both run in a child process (`_emulators_in_a_child`)."""
    profile: Profile = "anthropic" if api == "anthropic" else "hosted"
    settings = [
        EmulatorSettings(profile=profile, time_scale=time_scale, answer_family="embedded"),
        EmulatorSettings(
            profile="vllm",
            time_scale=time_scale,
            answer_family="embedded",
            broken_tool_calls=broken_tool_calls,
        ),
    ]
    if own_process:
        with _emulators_in_a_child(settings) as urls:
            yield EmulatedBackends(urls[0] + "/v1", urls[1] + "/v1")
        return
    with ExitStack() as stack:
        servers = [
            stack.enter_context(BackgroundServer(lambda s=s: build_app(s))) for s in settings
        ]
        yield EmulatedBackends(servers[0].url + "/v1", servers[1].url + "/v1")


# A spawned interpreter imports the emulator in about a second; a minute is a stuck child.
CHILD_START_S = 60.0


@contextmanager
def _emulators_in_a_child(settings: list[EmulatorSettings]) -> Iterator[list[str]]:
    """The emulators served by a process of their own, so that their work (token streams,
    prefix-cache bookkeeping) runs on another core than the proxy and its clients, rather
    than taking turns with them for one interpreter's lock. Their URLs, in order."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    child = context.Process(
        target=_serve_emulators, args=(settings, theirs), name="kvmigrate-emulators", daemon=True
    )
    child.start()
    theirs.close()
    try:
        try:
            if not ours.poll(CHILD_START_S):
                raise RuntimeError(f"the emulators did not start within {CHILD_START_S:g} s")
            urls: list[str] = ours.recv()
        except EOFError:
            child.join(5)
            raise RuntimeError(
                f"the emulators' process ended (exit code {child.exitcode}) before serving"
            ) from None
        yield urls
    finally:
        with contextlib.suppress(OSError):
            ours.send(None)
        ours.close()
        child.join(5)
        if child.is_alive():
            child.kill()
            child.join()


def _serve_emulators(settings: list[EmulatorSettings], parent: Connection) -> None:
    """In the child: serve until the parent says stop, or is gone (its end of the pipe
    closes; a parent killed outright takes the child with it)."""
    set_parent_death_signal(signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    with ExitStack() as stack:
        servers = [
            stack.enter_context(BackgroundServer(lambda s=s: build_app(s))) for s in settings
        ]
        parent.send([server.url for server in servers])
        with contextlib.suppress(EOFError, OSError):
            parent.recv()


def embedded_config(
    backends: EmulatedBackends,
    host: str = "127.0.0.1",
    port: int = 4000,
    mode: str = "shadow",
    percent: float = 0,
    state_dir: str = ".kvmigrate",
    candidate_model: str = VLLM_MODEL,
    rollout: dict[str, Any] | None = None,
    api: str = "openai",
    more_models: tuple[str, ...] = (),
    gpu: dict[str, Any] | None = None,
) -> Config:
    """The config the embedded default runs with: shadow everything to the emulated vLLM.
    `rollout` overrides keys of the rollout section (gates for a demo, say); `api` as for
    `emulated_backends`; `more_models` are further chat models (each its own cohort) served
    like the first. `gpu`: the config's `gpu` section (see `emulated_gpu`)."""
    hosted: dict[str, Any] = {"api_base": backends.hosted_url}
    first = HOSTED_MODEL
    models: list[dict[str, Any]] = [
        {"model_name": HOSTED_MODEL, "hosted": HOSTED_MODEL, "vllm": candidate_model},
        {"model_name": EMBEDDING_MODEL, "hosted": EMBEDDING_MODEL},
    ]
    if api == "anthropic":
        hosted["type"] = "anthropic"
        first = CLAUDE_MODEL
        models = [{"model_name": CLAUDE_MODEL, "hosted": CLAUDE_MODEL, "vllm": candidate_model}]
    models += [{"model_name": m, "hosted": first, "vllm": candidate_model} for m in more_models]
    data: dict[str, Any] = {
        "server": {"host": host, "port": port, "admin_key": EMBEDDED_ADMIN_KEY},
        "backends": {"hosted": hosted, "vllm": {"api_base": backends.vllm_url}},
        "models": models,
        "rollout": {
            "mode": mode,
            "percent": percent,
            "shadow_sample": 1.0,
            "state": f"sqlite:///{state_dir}/state.db",
            **(rollout or {}),
        },
        "record": {"db": f"sqlite:///{state_dir}/records.db"},
    }
    if gpu is not None:
        data["gpu"] = gpu
    return parse_config(yaml.safe_dump(data, sort_keys=False), source="<embedded default>", env={})


def emulated_gpu(backends: EmulatedBackends, interval_seconds: float = 1.0) -> dict[str, Any]:
    """A `gpu` section that scrapes the emulated vLLM's /metrics and its emulated DCGM
    exporter (kvmigrate.emulator.dcgm), so the report's GPU figures have a source."""
    root = backends.vllm_url.removesuffix("/v1")
    return {
        "scrape": True,
        "interval_seconds": interval_seconds,
        "dcgm_urls": [root + DCGM_PATH],
    }
