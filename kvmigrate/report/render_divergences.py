"""The HTML report's divergences view: each differing pair side by side, as Diffy shows them.

Words only one answer has are marked (`<del>` in the primary's, `<ins>` in the candidate's);
the list filters by comparator, cohort, candidate (when a model shadows to several) and
verdict, from the page's controls or its URL fragment
(`report.html#comparator=tool_calls&cohort=beta`), so a filtered view can be linked. The
diff is computed here, once; the page's script only hides and shows.
"""

from __future__ import annotations

import re
from difflib import SequenceMatcher

from kvmigrate.html_text import escape
from kvmigrate.render import fmt
from kvmigrate.report.model import DivergentPair, Report

STYLE = """
.filters { margin: .5rem 0 1rem; display: flex; gap: 1.2rem; align-items: center; }
div.pair { border: 1px solid #e3e3e3; border-radius: 6px; margin: .8rem 0; padding: .5rem .8rem; }
div.pair-head { color: #444; margin-bottom: .4rem; }
span.tag { border-radius: 4px; padding: 0 .35rem; margin-left: .3rem; font-size: 12px; }
span.tag.diverged { background: #fde2e2; } span.tag.within_noise { background: #eee; }
div.sides { display: grid; grid-template-columns: 1fr 1fr; gap: 1rem; }
div.side h4 { margin: .2rem 0; font-size: 13px; color: #555; }
div.side pre { white-space: pre-wrap; word-break: break-word; margin: 0;
  font: 13px/1.4 ui-monospace, monospace; }
del { background: #ffd7d5; text-decoration: line-through; }
ins { background: #ccf2d1; text-decoration: none; }
"""

# Hides the pairs the controls (or the URL fragment) filter out; counts what is shown on
# <body data-divergences-shown>, so a headless check can read the outcome of a filter.
SCRIPT = """(function () {
  var controls = ["comparator", "cohort", "candidate", "verdict"].map(function (k) {
    return [k, document.getElementById("divergence-" + k)];
  }).filter(function (c) { return c[1]; });
  var asked = new URLSearchParams(location.hash.slice(1));
  controls.forEach(function (c) { if (asked.get(c[0])) c[1].value = asked.get(c[0]); });
  function matches(pair, key, value) {
    if (!value) return true;
    if (key !== "comparator") return pair.dataset[key] === value;
    return (" " + pair.dataset.comparators + " ").indexOf(" " + value + " ") >= 0;
  }
  function apply() {
    var shown = 0;
    document.querySelectorAll("div.pair").forEach(function (pair) {
      var keep = controls.every(function (c) { return matches(pair, c[0], c[1].value); });
      pair.hidden = !keep;
      shown += keep ? 1 : 0;
    });
    document.body.dataset.divergencesShown = String(shown);
  }
  controls.forEach(function (c) { c[1].addEventListener("change", apply); });
  apply();
})();"""

_TOKENS = re.compile(r"\s+|\S+")


def divergences_section(report: Report) -> str:
    head = '<h2 id="divergences">Divergences</h2>'
    pairs = report.divergences
    if not pairs:
        return head + '<p class="note">No scored pair answered differently in this window.</p>'
    shown = (
        f"all {len(pairs)}"
        if len(pairs) == report.divergent_total
        else f"the worst {len(pairs)} of {report.divergent_total}"
    )
    note = (
        f'<p class="note">Pairs whose answers differ ({shown}): beyond the request\'s noise '
        "first (red tags), then within it (grey: the primary's own repeat differed there "
        "too). Marked words are in one answer only.</p>"
    )
    cohorts = {p.cohort for p in pairs if p.cohort is not None} | {c.cohort for c in report.cohorts}
    return "\n".join(
        [head, note, _filters(pairs, sorted(cohorts)), *(_pair(p, report) for p in pairs)]
    )


def _filters(pairs: list[DivergentPair], cohorts: list[str]) -> str:
    """Every cohort of the report is an option (the cohort selector sets this filter too),
    when there are several."""
    comparators = sorted({c for p in pairs for c in (*p.diverged_on, *p.within_noise)})
    parts = [_select("comparator", comparators), _select("verdict", ["diverged", "within_noise"])]
    candidates = sorted({p.backend for p in pairs if p.backend})
    if len(candidates) > 1:  # a model shadowed to several: which one answered differently
        parts.insert(1, _select("candidate", candidates))
    if len(cohorts) > 1:
        parts.insert(1, _select("cohort", cohorts))
    return f'<div class="filters">{"".join(parts)}</div>'


def _select(key: str, values: list[str]) -> str:
    options = "".join(f'<option value="{escape(v)}">{escape(v)}</option>' for v in values)
    return (
        f'<label>{key} <select id="divergence-{key}"><option value="">all</option>'
        f"{options}</select></label>"
    )


def _pair(pair: DivergentPair, report: Report) -> str:
    tags = "".join(f'<span class="tag diverged">{escape(c)}</span>' for c in pair.diverged_on)
    tags += "".join(f'<span class="tag within_noise">{escape(c)}</span>' for c in pair.within_noise)
    cohort = f" cohort {escape(pair.cohort)} &middot;" if pair.cohort is not None else ""
    primary, candidate = marked_diff(pair.primary, pair.candidate)
    return (
        f'<div class="pair" data-request="{escape(pair.request_id)}" '
        f'data-comparators="{escape(" ".join((*pair.diverged_on, *pair.within_noise)))}" '
        f'data-cohort="{escape(pair.cohort or "")}" data-candidate="{escape(pair.backend)}" '
        f'data-verdict="{pair.verdict}">'
        f'<div class="pair-head">{escape(pair.conversation)} turn {pair.turn} &middot;{cohort} '
        f"agreement {fmt.pct(pair.score)} &middot; {escape(pair.request_id)}{tags}</div>"
        '<div class="sides">'
        f'<div class="side primary"><h4>primary ({escape(report.primary)})</h4>'
        f"<pre>{primary}</pre></div>"
        f'<div class="side candidate"><h4>candidate ({escape(pair.backend or report.candidate)})'
        "</h4>"
        f"<pre>{candidate}</pre></div></div></div>"
    )


def marked_diff(primary: str, candidate: str) -> tuple[str, str]:
    """Both texts as HTML, the words only the primary has in <del>, only the candidate
    has in <ins> (whitespace runs are tokens too, so the layout survives)."""
    a, b = _TOKENS.findall(primary), _TOKENS.findall(candidate)
    left: list[str] = []
    right: list[str] = []
    for op, i1, i2, j1, j2 in SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        old, new = escape("".join(a[i1:i2])), escape("".join(b[j1:j2]))
        if op == "equal":
            left.append(old)
            right.append(new)
            continue
        if old:
            left.append(f"<del>{old}</del>")
        if new:
            right.append(f"<ins>{new}</ins>")
    return "".join(left), "".join(right)
