"""Answers are a function of prompt and seed; without a seed, noise makes calls differ."""

from __future__ import annotations

from emulator_support import StartEmulator, client, model_of

from kvmigrate.emulator.parsing import NOISE_SEED_HEADER
from kvmigrate.serving import BackgroundServer

PROMPT = [{"role": "user", "content": "Summarise the history of the printing press in Europe"}]


def _answers(server: BackgroundServer, count: int, **kwargs: object) -> list[str]:
    with client(server) as sdk:
        return [
            sdk.chat.completions.create(
                model=model_of(server),
                messages=PROMPT,  # type: ignore[arg-type]
                **kwargs,  # type: ignore[arg-type]
            )
            .choices[0]
            .message.content
            or ""
            for _ in range(count)
        ]


def test_seed_reproduces_exactly(any_server: BackgroundServer) -> None:
    assert len(set(_answers(any_server, 3, seed=42))) == 1
    by_seed = {_answers(any_server, 1, seed=s)[0] for s in (1, 2, 3, 4)}
    assert len(by_seed) > 1


def test_noise_varies_unseeded_calls(vllm_server: BackgroundServer) -> None:
    answers = _answers(vllm_server, 6)
    assert len(set(answers)) > 1
    # Variation is a reworded answer on the same topic, not a different answer.
    topic = ("history", "printing", "press", "europe")
    assert all(any(word in a.lower() for word in topic) for a in answers)


def test_temperature_zero_is_greedy(vllm_server: BackgroundServer) -> None:
    assert len(set(_answers(vllm_server, 4, temperature=0))) == 1


def test_zero_noise_is_deterministic(start_emulator: StartEmulator) -> None:
    server = start_emulator("hosted", noise=0.0)
    assert len(set(_answers(server, 4))) == 1


def test_different_topics_give_different_answers(hosted_server: BackgroundServer) -> None:
    with client(hosted_server) as sdk:
        other = sdk.chat.completions.create(
            model=model_of(hosted_server),
            messages=[{"role": "user", "content": "Describe volcanic eruptions in Iceland"}],
            seed=1,
        )
    text = other.choices[0].message.content or ""
    assert "printing" not in text.lower()
    assert "volcanic" in text.lower() or "eruptions" in text.lower() or "iceland" in text.lower()


def test_profiles_answer_differently(
    hosted_server: BackgroundServer, vllm_server: BackgroundServer
) -> None:
    assert _answers(hosted_server, 1, seed=5) != _answers(vllm_server, 1, seed=5)


def _noise_seeded(server: BackgroundServer, value: str, **kwargs: object) -> str:
    return _answers(server, 1, extra_headers={NOISE_SEED_HEADER: value}, **kwargs)[0]


def test_a_noise_seed_replays_an_unseeded_call_and_leaves_its_sampling_alone(
    vllm_server: BackgroundServer,
) -> None:
    """`x-emulator-noise-seed` makes two unseeded calls replayable (a labelled set the same on
    every run), while different noise seeds still vary them as samples do."""
    replayed = {_noise_seeded(vllm_server, "7") for _ in range(3)}
    assert len(replayed) == 1
    varied = {_noise_seeded(vllm_server, str(seed)) for seed in range(1, 7)}
    assert len(varied) > 1
    # A request's own seed decides the whole answer, as without the header.
    assert _noise_seeded(vllm_server, "7", seed=3) == _answers(vllm_server, 1, seed=3)[0]
    # At temperature 0 there is no noise to seed.
    assert _noise_seeded(vllm_server, "7", temperature=0) == _noise_seeded(
        vllm_server, "8", temperature=0
    )


def test_a_noise_seed_that_is_not_a_whole_number_is_ignored(
    vllm_server: BackgroundServer,
) -> None:
    for value in ("-1", "seven", "1e3", "9" * 20, "0x10"):
        assert len({_noise_seeded(vllm_server, value) for _ in range(6)}) > 1
