"""Answers are a function of prompt and seed; without a seed, noise makes calls differ."""

from __future__ import annotations

from emulator_support import StartEmulator, client, model_of

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
