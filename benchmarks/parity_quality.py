"""Print the parity engine's quality figures: divergences flagged and false alarms.

Builds the labelled set of kvmigrate.parity.labelled against an emulated backend (noise-only
pairs, and pairs with a wrong tool name, a wrong argument, broken JSON, a truncated answer,
a refusal, an answer on another topic) and scores it with the default thresholds.

    .venv/bin/python benchmarks/parity_quality.py [--noise 0.3] [--per-class 40] [--runs 3]
"""

from __future__ import annotations

import argparse

from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.parity.labelled import DIVERGENCES, build_labelled_set, http_poster, measure_quality
from kvmigrate.serving import BackgroundServer

MODELS = {"hosted": "gpt-4o-mini", "vllm": "meta-llama/Llama-3.1-8B-Instruct"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--noise", type=float, default=0.3, help="the emulator's noise knob")
    parser.add_argument("--per-class", type=int, default=40, help="pairs per divergence")
    parser.add_argument("--noise-pairs", type=int, default=240, help="noise-only pairs")
    parser.add_argument("--runs", type=int, default=3, help="labelled sets per profile")
    args = parser.parse_args()
    print(f"emulator noise {args.noise}; {args.per_class} pairs per divergence, "
          f"{args.noise_pairs} noise pairs, {args.runs} run(s) per profile")  # fmt: skip
    for profile, model in MODELS.items():
        settings = EmulatorSettings(profile=profile, time_scale=0.0, noise=args.noise)
        with BackgroundServer(lambda s=settings: build_app(s)) as server:
            post = http_poster(server.url + "/v1")
            for run in range(args.runs):
                pairs = build_labelled_set(post, model, per_class=args.per_class,
                                           noise_pairs=args.noise_pairs, seed=run)  # fmt: skip
                figures = measure_quality(pairs)
                per_class = "  ".join(f"{d} {figures.detection[d]:.0%}" for d in DIVERGENCES)
                print(f"{profile:<7} run {run}: flagged {figures.detection_rate:6.1%}  "
                      f"false alarms {figures.false_alarm_rate:5.1%}   {per_class}")  # fmt: skip


if __name__ == "__main__":
    main()
