"""Reading vLLM's /metrics across its versions' names, DCGM's and Prometheus's answers:
tables of exposition text and the figures each must give."""

from __future__ import annotations

import math

import orjson
import pytest

from kvmigrate.engine.gpu_util import UnreadableAnswer, read_dcgm, read_prometheus
from kvmigrate.engine.prom_text import parse
from kvmigrate.engine.vllm_sample import FIGURES, read_vllm

V1 = """# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="tiny"} 0.75
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
vllm:num_requests_running{engine="1",model_name="tiny"} 2.0
vllm:num_requests_waiting{engine="0",model_name="tiny"} 1.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny",reason="capacity"} 9.0
vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 600.0
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 288.0
vllm:prefix_cache_queries_created{engine="0",model_name="tiny"} 1.79e+09
vllm:prompt_tokens_total{engine="0",model_name="tiny"} 616.0
vllm:generation_tokens_total{engine="0",model_name="tiny"} 16.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.02",model_name="tiny"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.04",model_name="tiny"} 2.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="tiny"} 2.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="tiny"} 2.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="tiny"} 0.05
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.01",model_name="tiny"} 14.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="tiny"} 14.0
vllm:inter_token_latency_seconds_count{engine="0",model_name="tiny"} 14.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="tiny"} 0.04
"""
# The names of vLLM before its V1 engine's renames.
OLD = """vllm:gpu_cache_usage_perc{model_name="m"} 0.5
vllm:num_requests_running{model_name="m"} 1
vllm:num_requests_waiting{model_name="m"} 0
vllm:gpu_prefix_cache_queries_total{model_name="m"} 100
vllm:gpu_prefix_cache_hits_total{model_name="m"} 40
vllm:time_per_output_token_seconds_bucket{le="0.05",model_name="m"} 3
vllm:time_per_output_token_seconds_bucket{le="+Inf",model_name="m"} 4
vllm:time_per_output_token_seconds_sum{model_name="m"} 0.3
vllm:time_per_output_token_seconds_count{model_name="m"} 4
"""


def test_v1_names_give_every_figure_summed_over_engines_and_usage_averaged() -> None:
    sample = read_vllm(V1)
    assert sample.kv_usage == 0.5  # the engines' mean, not their sum
    assert (sample.running, sample.waiting) == (5.0, 1.0)  # not the by-reason gauge
    assert (sample.prefix_queries, sample.prefix_hits) == (600.0, 288.0)
    assert (sample.prompt_tokens, sample.generation_tokens) == (616.0, 16.0)
    assert sample.ttft is not None
    assert sample.ttft.buckets == ((0.02, 1.0), (0.04, 2.0), (math.inf, 2.0))
    assert (sample.ttft.sum, sample.ttft.count) == (0.05, 2.0)
    assert sample.itl is not None
    assert sample.itl.count == 14.0
    assert sample.absent == ()
    assert sample.bad_lines == 0


def test_older_names_are_read_and_what_they_lack_is_named_absent() -> None:
    sample = read_vllm(OLD)
    assert sample.kv_usage == 0.5
    assert (sample.prefix_queries, sample.prefix_hits) == (100.0, 40.0)
    assert sample.itl is not None
    assert sample.itl.buckets == ((0.05, 3.0), (math.inf, 4.0))
    assert sample.absent == ("prompt_tokens", "generation_tokens", "ttft")
    assert not sample.empty


@pytest.mark.parametrize(
    ("text", "bad", "empty"),
    [
        ("", 0, True),
        ("<html>not metrics</html>\n\x00\xff{{{", 0, True),
        ('vllm:kv_cache_usage_perc{engine="0" 0.5\nvllm:num_requests_running x', 2, True),
        ('vllm:kv_cache_usage_perc{engine="0"} NaN\nvllm:num_requests_running 1', 1, False),
        ('vllm:num_requests_running{a="x\\"}y"} 2', 0, False),  # an escaped quote
    ],
)
def test_unreadable_lines_are_counted_never_raised(text: str, bad: int, empty: bool) -> None:
    sample = read_vllm(text)
    assert sample.bad_lines == bad
    assert sample.empty is empty
    assert len(sample.absent) == len(FIGURES) - (0 if empty else 1)


def test_label_values_are_unescaped() -> None:
    parsed = parse('m{a="x\\"y",b="p\\\\q",c="l\\nm"} 1 1700000000000\n', ("m",))
    assert parsed.series[0].labels == {"a": 'x"y', "b": "p\\q", "c": "l\nm"}
    assert parsed.series[0].value == 1.0


DCGM = """# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",Hostname="n1"} 60
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-b",Hostname="n1"} 90
DCGM_FI_DEV_MEM_COPY_UTIL{gpu="0",UUID="GPU-a",Hostname="n1"} 5
"""


def test_dcgm_utilisation_is_the_mean_of_its_gpus() -> None:
    sample = read_dcgm(DCGM)
    assert (sample.util_pct, sample.gpus) == (75.0, 2)


def test_dcgm_without_the_utilisation_series_says_so() -> None:
    with pytest.raises(UnreadableAnswer, match="no DCGM_FI_DEV_GPU_UTIL series"):
        read_dcgm("DCGM_FI_DEV_MEM_COPY_UTIL 5\n")


@pytest.mark.parametrize(
    ("answer", "value"),
    [
        ({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {}, "value": [1700000000, "72.5"]}]}}, 72.5),
        ({"status": "success", "data": {"resultType": "scalar", "result": [1, "40"]}}, 40.0),
    ],
)  # fmt: skip
def test_a_prometheus_answer_gives_its_first_value(answer: object, value: float) -> None:
    sample = read_prometheus(orjson.dumps(answer))
    assert (sample.util_pct, sample.gpus) == (value, None)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"<html>", "not a Prometheus query answer (JSONDecodeError)"),
        (b'{"status": "success", "data": {"resultType": "vector", "result": []}}',
         "the query returned no series"),
        (b'{"status": "error", "data": {"result": []}, "error": "parse error"}',
         "the query failed: parse error"),
        (b'{"status": "success", "data": {"resultType": "vector", "result": [{"value": [1, "NaN"]}]}}',
         "the query returned a value that is not a percent (0 to 100)"),
        (b'{"status": "success", "data": {"resultType": "vector", "result": [{"value": [1, "1e308"]}]}}',
         "the query returned a value that is not a percent (0 to 100)"),
        (b'{"status": "success", "data": {"resultType": "scalar", "result": [1, "-3"]}}',
         "the query returned a value that is not a percent (0 to 100)"),
        (b'{"data": 3}', "not a Prometheus query answer (TypeError)"),
    ],
)  # fmt: skip
def test_an_unusable_prometheus_answer_says_why(body: bytes, reason: str) -> None:
    with pytest.raises(UnreadableAnswer) as raised:
        read_prometheus(body)
    assert str(raised.value) == reason


def test_readings_outside_what_a_figure_can_be_are_no_readings() -> None:
    """A broken or hostile exporter's 1e308 would make every mean over it infinite: a share
    above 1, a percent above 100 or a count beyond any engine's is dropped like a NaN."""
    sample = read_vllm(
        'vllm:kv_cache_usage_perc{engine="0"} 1e308\n'
        'vllm:kv_cache_usage_perc{engine="1"} 0.5\n'
        "vllm:num_requests_running 1e308\n"
        "vllm:num_requests_waiting 3\n"
    )
    assert (sample.kv_usage, sample.running, sample.waiting) == (0.5, None, 3.0)
    assert "running" in sample.absent
    gpus = read_dcgm(
        'DCGM_FI_DEV_GPU_UTIL{gpu="0"} 1e308\nDCGM_FI_DEV_GPU_UTIL{gpu="1"} 60\n'
        'DCGM_FI_DEV_GPU_UTIL{gpu="2"} -1\n'
    )
    assert (gpus.util_pct, gpus.gpus) == (60.0, 1)
    with pytest.raises(UnreadableAnswer, match="no DCGM_FI_DEV_GPU_UTIL series"):
        read_dcgm('DCGM_FI_DEV_GPU_UTIL{gpu="0"} 1e308\n')
