"""Cache-buster detection: find what in a team's prompts defeats prefix caching.

Pure functions over request and response bodies; the proxy addon (`addon.py`) and the CLI
(`kvmigrate cachecheck`) are thin users of them.
"""

from kvmigrate.cachecheck.analyze import Conversation, Turn, check_all, check_conversation
from kvmigrate.cachecheck.classes import DELIBERATE, DESCRIPTIONS, BreakClass
from kvmigrate.cachecheck.classify import Break, Location
from kvmigrate.cachecheck.compare import TokenCounter, Tokenize, TurnCheck, compare
from kvmigrate.cachecheck.dataset import Dataset, load_dataset, parse_lines
from kvmigrate.cachecheck.render import Rendering, Segment, answer_message, render_request
from kvmigrate.cachecheck.waste import CostModel, Summary
from kvmigrate.datasets import DatasetError

__all__ = [
    "DELIBERATE",
    "DESCRIPTIONS",
    "Break",
    "BreakClass",
    "Conversation",
    "CostModel",
    "Dataset",
    "DatasetError",
    "Location",
    "Rendering",
    "Segment",
    "Summary",
    "TokenCounter",
    "Tokenize",
    "Turn",
    "TurnCheck",
    "answer_message",
    "check_all",
    "check_conversation",
    "compare",
    "load_dataset",
    "parse_lines",
    "render_request",
]
