"""The HTML page every kvmigrate report shares (the report, the plan): its style, and the
script that marks it rendered."""

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2rem auto; max-width: 1340px; color: #222; }
h1 { margin-bottom: .2rem; } h2 { margin-top: 2rem; border-bottom: 1px solid #ddd; }
ul.summary { color: #444; } .note { color: #666; font-style: italic; }
.footnote { color: #555; font-size: 13px; max-width: 900px; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(640px, 1fr)); gap: 1rem; }
svg.chart { background: #fff; border: 1px solid #e3e3e3; border-radius: 6px; }
svg .title { font-weight: 600; font-size: 14px; } svg .tick { font-size: 11px; fill: #555; }
svg .label, svg .legend { font-size: 12px; fill: #333; }
svg .grid { stroke: #eee; } svg .axis { stroke: #999; }
svg .empty { fill: #fafafa; stroke: #ddd; stroke-dasharray: 4 4; }
svg .placeholder { fill: #888; font-size: 14px; }
svg circle.pt:hover { r: 5; }
table { border-collapse: collapse; margin: .5rem 0 1rem; }
th, td { padding: .25rem .6rem; border-bottom: 1px solid #eee; text-align: right; }
th:first-child, td:first-child { text-align: left; } th { background: #f6f6f6; }
"""

# It marks the page as rendered, so a headless check can tell a page whose charts were
# parsed from one that failed (no library, nothing fetched). The divergences view adds its
# filter.
SCRIPT = (
    'document.body.dataset.charts = String(document.querySelectorAll("svg.chart").length);'
    'document.body.dataset.ready = "1";'
)
