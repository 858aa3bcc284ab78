"""deploy/grafana: the dashboard is valid JSON with a sane layout, and every PromQL expression
parses (promql-parser) and names only metrics that kvmigrate defines or vLLM exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import promql_parser
import pytest

REPO = Path(__file__).resolve().parents[2]
DASHBOARD_FILE = REPO / "deploy" / "grafana" / "kvmigrate-dashboard.json"
DASHBOARD: dict[str, Any] = json.loads(DASHBOARD_FILE.read_text(encoding="utf-8"))
PANELS: list[dict[str, Any]] = DASHBOARD["panels"]

# vLLM's metric families (vllm/v1/metrics/loggers.py in vLLM 0.32, the pinned image), as
# exposed: counters with _total, histograms with _bucket/_sum/_count. test_deploy_vllm.py
# cross-checks the ones the dashboard uses against the installed vLLM where it exists.
VLLM_COUNTERS = {
    "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:prompt_tokens_cached",
    "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:request_success",
    "vllm:num_preemptions",
}  # fmt: skip
VLLM_GAUGES = {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"}
VLLM_HISTOGRAMS = {
    "vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
    "vllm:inter_token_latency_seconds", "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
}  # fmt: skip
# The proxy metrics the dashboard must show (the operator's questions, one panel each).
REQUIRED = {
    "kvmigrate_requests_total", "kvmigrate_errors_total", "kvmigrate_ttft_seconds_bucket",
    "kvmigrate_overhead_seconds_bucket", "kvmigrate_tokens_total",
    "kvmigrate_shadow_dropped_total", "kvmigrate_fallbacks_total", "kvmigrate_rollout_percent",
    "kvmigrate_rollout_split", "kvmigrate_rollout_version", "kvmigrate_auto_rollbacks_total",
    "kvmigrate_records_dropped_total", "vllm:time_to_first_token_seconds_bucket",
    "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
}  # fmt: skip
_CONSTRUCTOR = re.compile(
    r"\b(Counter|Gauge|Histogram|Summary|Info|CounterMetricFamily|GaugeMetricFamily|"
    r"HistogramMetricFamily|SummaryMetricFamily|gauge_function)\(\s*[\"']"
    r"([a-zA-Z_:][a-zA-Z0-9_:]*)[\"']"
)
_SUFFIXES = {
    "Counter": ("_total",),
    "CounterMetricFamily": ("_total",),
    "Gauge": ("",),
    "GaugeMetricFamily": ("",),
    "gauge_function": ("",),  # ProxyMetrics.gauge_function: a gauge read at scrape time
    "Info": ("_info",),
    "Histogram": ("_bucket", "_sum", "_count"),
    "HistogramMetricFamily": ("_bucket", "_sum", "_count"),
    "Summary": ("", "_sum", "_count"),
    "SummaryMetricFamily": ("", "_sum", "_count"),
}


def _with_suffixes(names: set[str], suffixes: tuple[str, ...]) -> set[str]:
    return {n.removesuffix("_total") + s for n in names for s in suffixes}


def kvmigrate_metric_names() -> set[str]:
    """Exposed names of every kvmigrate_* metric constructed in kvmigrate/ (the emulator's
    vllm:* imitations excluded: vLLM's own names come from the list above)."""
    found: set[str] = set()
    for path in (REPO / "kvmigrate").rglob("*.py"):
        for kind, name in _CONSTRUCTOR.findall(path.read_text(encoding="utf-8")):
            if name.startswith("kvmigrate_"):
                found |= _with_suffixes({name}, _SUFFIXES[kind])
    return found


def vllm_metric_names() -> set[str]:
    return (
        _with_suffixes(VLLM_COUNTERS, ("_total",))
        | VLLM_GAUGES
        | _with_suffixes(VLLM_HISTOGRAMS, ("_bucket", "_sum", "_count"))
    )


def _targets() -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in PANELS for t in p.get("targets", [])]


def _selector_names(expr: str) -> set[str]:
    # Grafana's interval variables are durations at query time.
    concrete = re.sub(r"\$(__rate_interval|__interval|__range)\b", "5m", expr)
    ast = promql_parser.parse(concrete)
    names: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            assert node.name, f"selector without a metric name in {expr!r}"
            names.add(node.name)

    promql_parser.walk(ast, visit)
    return names


def test_metric_name_extraction_sees_the_proxy_metrics() -> None:
    names = kvmigrate_metric_names()
    # A sanity check of the regex itself, against names the code is known to define.
    assert {"kvmigrate_requests_total", "kvmigrate_ttft_seconds_bucket",
            "kvmigrate_rollout_percent", "kvmigrate_records_written_total",
            "kvmigrate_recorder_queue_depth", "kvmigrate_auto_rollbacks_total"} <= names  # fmt: skip


@pytest.mark.parametrize(("title", "expr"), _targets(), ids=[t for t, _ in _targets()])
def test_expression_parses_and_uses_only_known_metrics(title: str, expr: str) -> None:
    known = kvmigrate_metric_names() | vllm_metric_names()
    unknown = _selector_names(expr) - known
    assert not unknown, f"{title}: unknown metrics {sorted(unknown)}"


def test_dashboard_covers_the_rollout_questions() -> None:
    used = set().union(*(_selector_names(e) for _, e in _targets()))
    assert used >= REQUIRED, sorted(REQUIRED - used)
    exprs = " ".join(e for _, e in _targets())
    assert "histogram_quantile(0.95" in exprs
    assert "histogram_quantile(0.99" in exprs


def test_panel_ids_are_unique_and_layout_fits_the_grid() -> None:
    ids = [p["id"] for p in PANELS]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in PANELS:
        grid = panel["gridPos"]
        assert {"h", "w", "x", "y"} <= grid.keys(), panel["title"]
        assert all(isinstance(grid[k], int) and grid[k] >= 0 for k in "hwxy")
        assert grid["w"] > 0, panel["title"]
        assert grid["h"] > 0, panel["title"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps another panel"
                cells.add((x, y))


def test_every_query_uses_the_datasource_variable() -> None:
    variables = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in PANELS:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert ref_ids, panel["title"]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
    assert DASHBOARD["uid"]
    assert DASHBOARD["title"]
    assert DASHBOARD["schemaVersion"] >= 36
