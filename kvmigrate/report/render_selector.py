"""The HTML report's cohort selector: the fleet's view or one cohort's, of every section.

Each view is rendered in full, in Python, into the one file (`<section class="view">`); the
page's script only shows one and hides the others, so the report stays static and works
offline. The choice can come from the URL (`report.html#view=billing-bot`), so a cohort's
view can be linked, and it also sets the divergences view's cohort filter.
"""

from __future__ import annotations

from kvmigrate.html_text import escape
from kvmigrate.report.model import Report

SELECTOR_STYLE = """
.view-select { position: sticky; top: 0; background: #fff; padding: .4rem 0; z-index: 1;
  border-bottom: 1px solid #eee; }
.view-select select { font-size: 14px; }
"""

# Shows the chosen view; marks it on <body data-view>, so a headless check can read it.
SELECTOR_SCRIPT = """(function () {
  var select = document.getElementById("cohort-view");
  if (!select) return;
  var asked = new URLSearchParams(location.hash.slice(1)).get("view");
  var known = Array.prototype.some.call(select.options, function (o) {
    return o.value === asked;
  });
  if (known) select.value = asked;
  function show(sync) {
    var view = select.value;
    document.querySelectorAll("section.view").forEach(function (section) {
      section.hidden = section.dataset.view !== view;
    });
    var filter = document.getElementById("divergence-cohort");
    if (sync && filter) {
      filter.value = view;
      filter.dispatchEvent(new Event("change"));
    }
    document.body.dataset.view = view;
  }
  select.addEventListener("change", function () { show(true); });
  show(known);
})();"""


def cohort_selector(report: Report) -> str:
    """The control, when the traffic is several cohorts; nothing for one."""
    if not report.cohorts:
        return ""
    options = "".join(
        f'<option value="{escape(c.cohort)}">cohort {escape(c.cohort)}</option>'
        for c in report.cohorts
    )
    return (
        '<div class="view-select"><label>Show <select id="cohort-view">'
        f'<option value="">the whole fleet</option>{options}</select></label></div>'
    )
