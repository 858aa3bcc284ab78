"""What masking a conversation's opening costs on the proxy's loop, per request.

Conversation identity masks the timestamps and ids of a conversation's opening (its system
prompt and first user message) on every turn. Measured on the first 57 KB of
docs/performance-history.md (figures on most lines, and non-ASCII characters; the figures
in docs/performance.md were taken on the README of that size and shape, before it became a
short front page), as a long agent system prompt:
  whole       the text searched whole with every pattern (`mask_all`, what any non-ASCII
              prompt cost before lines were searched one by one)
  first turn  `mask_volatile` on a text never seen: only the lines with a digit searched
  next turns  the same prompt again with one line changed (a timestamp): the other lines
              come from the line cache
  same again  the same prompt unchanged: the whole text from the cache
  id run      96 KB of "id-id-...": once a square of its length (about 40 s), now one pass
  worst       8 MB on one line, with digits, never seen: searched up to the budget only

    python benchmarks/opening_mask.py [--reps 20]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from kvmigrate.policies.volatile import mask_all, mask_volatile

PROMPT = Path(__file__).resolve().parent.parent / "docs" / "performance-history.md"
PROMPT_CHARS = 57_000


def median_ms(work: Callable[[int], object], reps: int) -> float:
    times = []
    for rep in range(reps):
        started = time.perf_counter()
        work(rep)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def _letters(number: int) -> str:
    return "".join(chr(ord("a") + int(digit)) for digit in str(number))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20)
    reps = parser.parse_args().reps
    prompt = PROMPT.read_text()[:PROMPT_CHARS]
    # Each rep a prompt never seen (its own marker, in letters, on every line): first turns.
    fresh = [prompt.replace("\n", f" {_letters(rep)}\n") for rep in range(reps)]
    figures = {
        "whole_ms": median_ms(lambda rep: mask_all(fresh[rep]), reps),
        "first_turn_ms": median_ms(lambda rep: mask_volatile(fresh[rep]), reps),
        "next_turns_ms": median_ms(
            lambda rep: mask_volatile(f"Current time: 2025-01-06 10:{rep:02d}:07\n{prompt}"),
            reps,
        ),
        "same_again_ms": median_ms(lambda rep: mask_volatile(prompt), reps),
        "id_run_ms": median_ms(lambda rep: mask_volatile("id-" * 32_000 + f" {rep}"), reps),
        "worst_ms": median_ms(lambda rep: mask_volatile(f"{rep} " + "a1 " * 2_800_000), 3),
    }
    print(f"opening of {len(prompt):,} characters, median of {reps}")
    for name, value in figures.items():
        print(f"  {name:15s} {value:8.2f} ms")
    print(f"  whole over next turns: {figures['whole_ms'] / figures['next_turns_ms']:.0f}x")


if __name__ == "__main__":
    main()
