"""The multi-turn benchmark: TTFT per turn for any OpenAI-compatible endpoint.

`conversations` makes or reads the conversations, `runner` drives them with the openai
client, `stats` reduces the records to per-turn figures, `render` and `chart` present them.
"""

from kvmigrate.bench.conversations import Conversation, load_dataset, synthetic
from kvmigrate.bench.runner import BenchRun, RunSettings, Target, TurnRecord, run_bench
from kvmigrate.bench.stats import Summary, TurnStats, percentile, reduction, summarize
from kvmigrate.datasets import DatasetError

__all__ = [
    "BenchRun",
    "Conversation",
    "DatasetError",
    "RunSettings",
    "Summary",
    "Target",
    "TurnRecord",
    "TurnStats",
    "load_dataset",
    "percentile",
    "reduction",
    "run_bench",
    "summarize",
    "synthetic",
]
