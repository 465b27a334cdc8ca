"""Qwen2: the Llama architecture with a bias on the q/k/v projections (and none on o_proj).

Qwen2's optional sliding-window layers (``use_sliding_window`` from ``max_window_layers`` on, or
``layer_types``, as transformers reads them: ``config.py``) are not supported; the loader refuses such
checkpoints rather than attending over the full context silently.
"""

from __future__ import annotations

from engine.models.config import ModelConfig
from engine.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    @classmethod
    def attention_biases(cls, config: ModelConfig) -> tuple[bool, bool]:
        return True, False

    @classmethod
    def check_config(cls, config: ModelConfig) -> None:
        refuse_sliding_layers(config, "Qwen2")


def refuse_sliding_layers(config: ModelConfig, family: str) -> None:
    """Qwen2 and Qwen3 declare sliding-window layers alike; this engine attends over the full context, which
    would be another model for them, so such a checkpoint is refused."""
    if config.sliding_window is not None:
        raise ValueError(f"{family} config has sliding-window layers (sliding_window={config.sliding_window}, "
                         "from use_sliding_window=true past max_window_layers, or sliding_attention in layer_types); "
                         "sliding-window attention is not supported")
