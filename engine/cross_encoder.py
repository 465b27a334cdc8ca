"""vLLM's score API on a sequence classifier of one label (a cross-encoder reranker): both texts read at once.

Where an embedding model scores a pair by the cosine of two separate embeddings (engine/embedding_scores.py), a
cross-encoder reads the pair as one prompt and its score head gives one logit, whose sigmoid is the score. The
prompt is the tokenizer's encoding of the pair (``tokenizer(text_1, text_2)``: its own separators and special
tokens, as vLLM builds it); a side given as token ids is taken as is, the two sides concatenated.
"""

from __future__ import annotations

CROSS_ENCODER_LABELS = 1


def check_cross_encoder(labels: list[str]) -> None:
    """Scoring needs one label: its sigmoid is the pair's score. Several labels are a classifier's (classify)."""
    if len(labels) != CROSS_ENCODER_LABELS:
        raise ValueError(f"scoring needs a classifier of one label (a cross-encoder); this model has {len(labels)} "
                         f"labels ({', '.join(labels[:5])}): classify the texts instead")


def pair_prompt(tokenizer, first: str | list[int], second: str | list[int]) -> list[int]:
    """The token ids a cross-encoder reads for the pair (``first``, ``second``)."""
    if isinstance(first, str) and isinstance(second, str):
        if tokenizer is None:
            raise ValueError("texts need the model's tokenizer; this engine has none (give token ids)")
        return list(tokenizer(first, second)["input_ids"])
    return _token_ids(tokenizer, first) + _token_ids(tokenizer, second)


def _token_ids(tokenizer, text: str | list[int]) -> list[int]:
    if not isinstance(text, str):
        return list(text)
    if tokenizer is None:
        raise ValueError("texts need the model's tokenizer; this engine has none (give token ids)")
    return list(tokenizer(text)["input_ids"])
