"""Progress off a terminal is one summary line (issue 21 item 14)."""

from __future__ import annotations

import io

from kvmigrate.progress import progress


def test_off_a_terminal_progress_is_one_summary_line() -> None:
    out = io.StringIO()
    with progress(3, "  requests", file=out, show_pos=True) as bar:
        for _ in range(3):
            bar.update(1)
    assert out.getvalue() == "requests: 3/3\n"
