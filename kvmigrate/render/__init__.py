"""Rendering helpers shared by the report, the planner and the benchmark: figures as text
(`fmt`), tables as text, Markdown and HTML (`table`), the HTML page's style (`page`) and
inline SVG charts (`svg`). A leaf: it knows no report, plan or benchmark, so each of them
renders without loading the others."""
