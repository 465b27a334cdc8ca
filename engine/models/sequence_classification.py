"""Sequence-classification checkpoints (transformers' ``*ForSequenceClassification``): rerankers and classifiers.

The decoder is the causal LM's; in place of the LM head a linear ``score`` layer (no bias) maps the hidden state
of the last position (after the final norm) to ``num_labels`` logits, as transformers does for an unpadded
sequence. Such a model cannot generate: it runs in a pooling engine (``runner="pooling"``), whose pooler hands
the last position's state to ``score`` (engine/runner/pooler.py), and ``LLM.classify`` returns the labels'
probabilities: a softmax over the labels, or, for a single label (a cross-encoder reranker), its sigmoid, as
vLLM's default activation does.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.models.config import ModelConfig

# Architecture names whose decoder is that of the causal-LM class of the same prefix.
SEQUENCE_CLASSIFICATION_SUFFIX = "ForSequenceClassification"


def is_sequence_classifier(architecture: str) -> bool:
    return architecture.endswith(SEQUENCE_CLASSIFICATION_SUFFIX)


def classification_labels(config: ModelConfig) -> list[str]:
    """The labels, in index order: config.json's ``id2label``, else ``num_labels`` of transformers' LABEL_i."""
    id2label = config.raw.get("id2label")
    if isinstance(id2label, dict) and id2label:
        try:
            by_index = {int(index): str(label) for index, label in id2label.items()}
        except (TypeError, ValueError):
            raise ValueError(f"config.json: id2label keys must be label indices, got {list(id2label)[:5]}") from None
        if sorted(by_index) != list(range(len(by_index))):
            raise ValueError(f"config.json: id2label must number its labels 0..{len(by_index) - 1}, got "
                             f"{sorted(by_index)[:5]}")
        return [by_index[index] for index in range(len(by_index))]
    num_labels = config.raw.get("num_labels", 2)  # transformers' default
    if not isinstance(num_labels, int) or isinstance(num_labels, bool) or num_labels < 1:
        raise ValueError(f"config.json: num_labels must be an integer >= 1, got {num_labels!r}")
    return [f"LABEL_{index}" for index in range(num_labels)]


class NoLMHead(nn.Module):
    """A classifier's missing LM head: a step that would sample from it is refused (never uninitialized logits)."""

    @property
    def weight(self) -> torch.Tensor:
        raise RuntimeError("a sequence-classification model has no LM head: it classifies (runner='pooling'), it "
                           "does not generate")


def sequence_classifier(causal_lm: type) -> type:
    """The ``*ForSequenceClassification`` model class of a causal-LM class: its decoder, and ``score``."""

    class SequenceClassifier(causal_lm):
        def __init__(self, config: ModelConfig, attention_backend="torch") -> None:
            super().__init__(config, attention_backend)
            self.labels = classification_labels(config)
            self.lm_head = NoLMHead()
            self.score = nn.Linear(config.hidden_size, len(self.labels), bias=False)

        def classify(self, pooled: torch.Tensor) -> torch.Tensor:
            """The last position's hidden state(s) [..., hidden] -> probabilities [..., num_labels], float32."""
            logits = self.score(pooled.to(self.score.weight.dtype)).to(torch.float32)
            return torch.sigmoid(logits) if logits.shape[-1] == 1 else torch.softmax(logits, dim=-1)

    SequenceClassifier.__name__ = SequenceClassifier.__qualname__ = \
        causal_lm.__name__.removesuffix("ForCausalLM") + SEQUENCE_CLASSIFICATION_SUFFIX
    return SequenceClassifier
