"""`mask_volatile`'s line scan: only the lines holding a digit go through the patterns, and
the result must be exactly what masking the whole text gives. Texts with digits at the very
start, on the first, middle and last lines, on adjacent lines, with and without a final
newline; an id spanning no newline, a timestamp at column 0."""

from __future__ import annotations

import pytest

from kvmigrate.policies import volatile
from kvmigrate.policies.volatile import MASK, mask_all, mask_volatile

TEXTS = [
    "2025-01-06T10:31:07Z",
    "1736159467 is when",
    "a\n2025-01-06 10:31\nb",
    "first line\nsecond line\nCurrent time: 2025-01-06 10:31:07\n",
    "Current time: 2025-01-06 10:31:07\nYou are a coding agent.\nrequest req_8f3a9c21e4",
    "x\ny\nz 12:45",
    "\n\n10:31\n\n",
    "trace-id 4f1c2a9be77d0c3a\ndate 2025-01-06\nthen plain text\nand a uuid "
    "123e4567-e89b-12d3-a456-426614174000 at the end",
    "no digits on this line\n7 items\nno digits either\n8 more items",
    "Invoice 0042 issued 06.01.2025, 10:31\nTotal: 3 items\n\nThanks",
    "0\n1\n2",
]


@pytest.mark.parametrize("text", TEXTS)
def test_the_line_scan_masks_what_the_whole_text_scan_masks(text: str) -> None:
    assert mask_volatile(text) == mask_all(text)


def test_only_volatile_values_change() -> None:
    text = "line one\nCurrent time: 2025-01-06 10:31:07\nline three 7 apples"
    masked = mask_volatile(text)
    assert masked == f"line one\nCurrent time: {MASK}\nline three 7 apples"
    later = text.replace("2025-01-06 10:31:07", "2025-02-07 11:45:00")
    assert mask_volatile(later) == masked


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # A bare weekday is a volatile value on a line with digits only: lines without a
        # digit are never searched (the docstring's trade), and keys built on that must stay.
        ("10:31\nsee you Monday", f"{MASK}\nsee you Monday"),
        ("Monday 10:31\nsee you Monday\n7 items", f"{MASK}\nsee you Monday\n7 items"),
        ("see you Monday\nat 10:31", f"see you Monday\nat {MASK}"),
    ],
)
def test_a_weekday_on_a_line_without_digits_is_left_alone(text: str, expected: str) -> None:
    assert mask_volatile(text) == expected


# A prefixed id's run, thousands of prefixes long: the digit that would make it an id was
# once looked for from every prefix inside it again, in time the square of its length
# (24 KB held the proxy's loop 2.6 s; this 96 KB about 40 s). It now takes about a
# millisecond; the timeout only catches that square coming back.
RUN = "id-" * 32_000


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (RUN + " 5", RUN + " 5"),  # no digit in the run: not an id, kept as it is
        ("before " + RUN + "7 after", f"before {MASK} after"),  # a digit: one id, one mask
        ("é " + RUN + " 5", "é " + RUN + " 5"),  # non-ASCII text is searched whole
        ("Zeit " + RUN + "7 é", f"Zeit {MASK} é"),
    ],
)
def test_a_long_run_of_id_prefixes_is_masked_in_one_pass(text: str, expected: str) -> None:
    assert mask_volatile(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("request req_8f3a9c21e4 done", f"request {MASK} done"),
        ("trace-id-4f1c2a", MASK),
        ("session_abcdef and more", "session_abcdef and more"),  # a word, not an id
        ("call_abcdef 10:31", f"call_abcdef {MASK}"),
    ],
)
def test_a_prefixed_run_is_an_id_only_with_a_digit(text: str, expected: str) -> None:
    assert mask_volatile(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Non-ASCII text is scanned line by line too, on any digit (`\d` matches them all).
        (
            "Tu es un agent é\nHeure : 2025-01-06 10:31:07\nà lundi, see you Monday",
            f"Tu es un agent é\nHeure : {MASK}\nà lundi, see you Monday",
        ),
        (
            "日付 \u0662\u0660\u0662\u0665-\u0660\u0661-\u0660\u0666 é",
            f"日付 {MASK} é",
        ),  # Arabic-Indic
        # A line too long to keep in the cache is masked all the same, every time.
        ("x" * 5000 + " at 2025-01-06\nend", "x" * 5000 + f" at {MASK}\nend"),
        ("é" + "x" * 5000 + " at 2025-01-06", "é" + "x" * 5000 + f" at {MASK}"),
    ],
)
def test_every_line_with_a_digit_is_masked_however_long_and_in_any_script(
    text: str, expected: str
) -> None:
    assert mask_volatile(text) == expected
    assert mask_volatile(text) == expected  # the second time from the cache, if it fits


def test_a_prompt_that_changes_one_line_a_turn_keeps_its_other_lines_masked() -> None:
    turn_one = "Rules v2.3 é\nCurrent time: 2025-01-06 10:31:07\nreq_8f3a9c21e4 seen"
    turn_two = turn_one.replace("2025-01-06 10:31:07", "2025-01-06 10:32:15")
    assert mask_volatile(turn_one) == mask_volatile(turn_two)
    assert mask_volatile(turn_two) == f"Rules v2.3 é\nCurrent time: {MASK}\n{MASK} seen"


def test_a_text_longer_than_the_search_budget_is_masked_up_to_it() -> None:
    """No request may hold the loop for long: lines past the budget are left as they are,
    the same way every time."""
    line = "at 2025-01-06 10:31"
    text = "\n".join([line] * (volatile.SEARCH_BUDGET // len(line) + 50))
    lines = mask_volatile(text).split("\n")
    searched = volatile.SEARCH_BUDGET // len(line)  # whole lines (their newline is free)
    assert set(lines[:searched]) == {f"at {MASK}"}
    assert set(lines[searched + 1 :]) == {line}
    copy = text.encode().decode()  # another object, masked again or from the cache alike
    assert mask_volatile(copy) == "\n".join(lines)
