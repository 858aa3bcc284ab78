"""A 50% split driven with the official openai SDK through a real proxy, recorder and
emulators: on one arm the client ends its conversations earlier and scores them lower
(POST /v1/feedback). The report finds both effects with intervals that exclude zero, and
none on an A/A split where the client treats both arms alike."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest

from kvmigrate.config import parse_config
from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.proxy import build_proxy_app
from kvmigrate.recorder.addon import RecorderAddon
from kvmigrate.recorder.store import open_store
from kvmigrate.report import build_report
from kvmigrate.report.render_html import render_html
from kvmigrate.report.render_json import report_dict
from kvmigrate.report.render_text import render_md, render_text
from kvmigrate.report.scorecard_model import Status
from kvmigrate.report.users import UsersFigures
from kvmigrate.serving import BackgroundServer

MODEL = "gpt-4o-mini"
CONVERSATIONS = 48
# What the client does on an arm: (turns, score) for conversation i and a seeded draw.
Behaviour = Callable[[str, int, random.Random], tuple[int, float]]


def alike(_arm: str, i: int, rng: random.Random) -> tuple[int, float]:
    return 3 + i % 4, round(min(5.0, max(1.0, rng.gauss(4.0, 0.7))), 1)


def candidate_worse(arm: str, i: int, rng: random.Random) -> tuple[int, float]:
    turns, score = alike(arm, i, rng)
    return (max(1, turns - 2), score - 1.5) if arm == "vllm" else (turns, score)


@pytest.fixture(scope="module")
def emulators() -> Iterator[tuple[str, str]]:
    hosted = BackgroundServer(lambda: build_app(EmulatorSettings(profile="hosted", time_scale=0)))
    vllm = BackgroundServer(lambda: build_app(EmulatorSettings(profile="vllm", time_scale=0)))
    with hosted, vllm:
        yield hosted.url, vllm.url


def _drive(url: str, behaviour: Behaviour, seed: int) -> None:
    client = openai.OpenAI(base_url=url + "/v1", api_key="sk-client", max_retries=0)
    rng = random.Random(seed)
    for i in range(CONVERSATIONS):
        session = f"user-{seed}-{i}"
        messages: list[Any] = [{"role": "user", "content": f"Plan trip {i}, day 1."}]
        arm = None
        turns, score = 1, 0.0
        turn = 0
        answer_id = ""
        while turn < turns:
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=messages, extra_headers={"X-Session-ID": session}
            )
            answer = raw.parse()
            if arm is None:  # the arm the split gave this conversation, as the proxy says
                arm = raw.headers["x-kvmigrate-backend"]
                turns, score = behaviour(arm, i, rng)
            answer_id = answer.id
            messages += [
                {"role": "assistant", "content": answer.choices[0].message.content},
                {"role": "user", "content": f"And day {turn + 2}?"},
            ]
            turn += 1
        # Half the scores name the conversation, half the last answer.
        target = {"conversation_id": session} if i % 2 else {"response_id": answer_id}
        client.post("/feedback", body={**target, "value": score}, cast_to=object)
    client.close()


def _report(tmp_path: Path, urls: tuple[str, str], behaviour: Behaviour, seed: int) -> Any:
    config = parse_config(
        f"""
backends:
  hosted: {{api_base: "{urls[0]}/v1"}}
  vllm: {{api_base: "{urls[1]}/v1"}}
models:
  - {{model_name: {MODEL}, hosted: {MODEL}, vllm: meta-llama/Llama-3.1-8B-Instruct}}
rollout: {{mode: split, percent: 50}}
""",
        env={},
    )
    db = f"sqlite:///{tmp_path}/records-{seed}.db"
    recorder = RecorderAddon(db, worker="thread")
    since = time.time() - 1
    with BackgroundServer(lambda: build_proxy_app(config, addons=[recorder])) as proxy:
        _drive(proxy.url, behaviour, seed)
    with open_store(db) as store:
        return build_report(store, since, time.time() + 1)


def test_the_report_finds_shorter_conversations_and_lower_scores_on_one_arm(
    tmp_path: Path, emulators: tuple[str, str]
) -> None:
    report = _report(tmp_path, emulators, candidate_worse, seed=1)
    users: UsersFigures = report.users
    hosted, vllm = users.arm("hosted"), users.arm("vllm")
    assert hosted is not None
    assert vllm is not None
    assert hosted.conversations + vllm.conversations == CONVERSATIONS
    assert min(hosted.conversations, vllm.conversations) >= 15  # a 50% split
    assert hosted.scores + vllm.scores == CONVERSATIONS
    assert users.unmatched_scores == 0
    turns, score = users.effect("turns"), users.effect("score")
    assert turns is not None
    assert score is not None
    print(f"\nturns {turns}\nscore {score}")
    assert turns.high < 0
    assert -3.0 < turns.difference < -1.0
    assert score.high < 0
    assert -2.0 < score.difference < -1.0
    # The scorecard's users row reads the same effect: the candidate's users are less happy.
    row = next(r for r in report.scorecard if r.key == "users")
    assert (row.primary, row.candidate) == (hosted.score_mean, vllm.score_mean)
    assert (row.estimate, row.low, row.high) == (score.difference, score.low, score.high)
    assert row.status is Status.MISSED
    # Every rendering carries the section.
    for text in (render_text(report), render_md(report), render_html(report)):
        assert "Whether users stay, by arm" in text
        assert "vllm minus hosted" in text
    data = orjson.loads(orjson.dumps(report_dict(report)))
    effects = {e["metric"]: e for e in data["users"]["effects"]}
    assert effects["turns"]["high"] < 0
    assert effects["score"]["high"] < 0


def test_an_aa_split_shows_no_effect(tmp_path: Path, emulators: tuple[str, str]) -> None:
    report = _report(tmp_path, emulators, alike, seed=2)
    users: UsersFigures = report.users
    turns, score = users.effect("turns"), users.effect("score")
    assert turns is not None
    assert score is not None
    print(f"\nturns {turns}\nscore {score}")
    assert not turns.excludes_zero
    assert not score.excludes_zero
    row = next(r for r in report.scorecard if r.key == "users")
    assert row.status is Status.NOT_ENOUGH
