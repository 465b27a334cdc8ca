"""Qwen2: the Llama architecture with a bias on the q/k/v projections (and none on o_proj).

Qwen2's optional sliding-window layers (``use_sliding_window`` from ``max_window_layers`` on, or
``layer_types``, as transformers reads them: ``config.py``) attend their window; the others the full context.
"""

from __future__ import annotations

from engine.models.config import ModelConfig
from engine.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    @classmethod
    def attention_biases(cls, config: ModelConfig) -> tuple[bool, bool]:
        return True, False
