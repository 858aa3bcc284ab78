"""Text for the HTML pages the CLI writes (the report, the plan, the bench): recorded
prompts and answers, model and cohort names, anyone's words.

`html.escape` stops markup, but not Unicode's bidirectional controls: a recorded value
holding U+202E (right-to-left override) visually reverses the rest of its table cell or
heading, so a page could show an operator figures or names other than the ones it holds.
Those controls are shown as visible escapes instead; every other character is kept.
"""

from __future__ import annotations

import html
import re

# Embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069), the implicit marks
# (U+200E, U+200F) and Arabic's letter mark (U+061C).
_BIDI_CONTROLS = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def escape(value: str, quote: bool = True) -> str:
    """`value` as HTML text (or an attribute's value), its bidi controls made visible."""
    return _BIDI_CONTROLS.sub(lambda m: f"\\u{ord(m.group()):04x}", html.escape(value, quote))
