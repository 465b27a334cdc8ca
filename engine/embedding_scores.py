"""vLLM's score API on an embedding model: the cosine similarity of two texts' embeddings.

``score(text_1, text_2)`` pairs its inputs as vLLM does: one text against each of N (1:N), or N against N in
order (N:N); any other pair of lengths is refused, naming ``text_2``. Each distinct input is embedded once
(a query against many documents costs one embedding of the query). A rerank (``/rerank``) is the 1:N case,
its results sorted best first. A cross-encoder (a sequence classifier reading both texts at once) scores pairs
its own way: engine/cross_encoder.py."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def score_texts(data: object, label: str) -> list[str | list[int]]:
    """One side's texts: a string or a token-id list is one text, a list of them several."""
    if isinstance(data, str):
        return [data]
    if isinstance(data, (list, tuple)) and data and all(isinstance(t, int) and not isinstance(t, bool) for t in data):
        return [list(data)]
    if isinstance(data, (list, tuple)) and all(isinstance(t, str) or isinstance(t, (list, tuple)) for t in data):
        return [text if isinstance(text, str) else list(text) for text in data]
    raise ValueError(f"{label} must be a string, a token-id list, or a list of them, got {type(data).__name__}")


def score_pairs(num_texts_1: int, num_texts_2: int) -> list[tuple[int, int]]:
    """The (i, j) pairs scored, in output order: 1:N, or N:N in order."""
    if num_texts_1 == 0 or num_texts_2 == 0:
        raise ValueError("text_1 and text_2 must each hold at least one text")
    if num_texts_1 == 1:
        return [(0, j) for j in range(num_texts_2)]
    if num_texts_1 != num_texts_2:
        raise ValueError(f"text_2 must hold one text for each of text_1's {num_texts_1} (or text_1 a single text "
                         f"scored against each of text_2's), got {num_texts_2}")
    return [(i, i) for i in range(num_texts_1)]


def distinct_inputs(texts: Sequence[str | list[int]]) -> tuple[list[str | list[int]], list[int]]:
    """The distinct inputs among ``texts`` in first-seen order, and each text's index among them."""
    distinct: list[str | list[int]] = []
    seen: dict[str | tuple[int, ...], int] = {}
    positions = []
    for text in texts:
        key = text if isinstance(text, str) else tuple(text)
        if key not in seen:
            seen[key] = len(distinct)
            distinct.append(text)
        positions.append(seen[key])
    return distinct, positions


def cosine_similarity(first: Sequence[float], second: Sequence[float]) -> float:
    """In float64, whatever the embeddings' own normalization (with normalize on, their dot product)."""
    a, b = np.asarray(first, dtype=np.float64), np.asarray(second, dtype=np.float64)
    norm = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b / norm) if norm > 0.0 else 0.0
