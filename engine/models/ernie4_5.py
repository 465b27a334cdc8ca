"""ERNIE 4.5 (``Ernie4_5ForCausalLM``: Baidu's ERNIE-4.5-0.3B, dense): the Llama architecture with RoPE on interleaved
pairs (computed in float32, as transformers computes it), one switch ``use_bias`` for the biases of every projection
(q, k, v, the output projection and the MLP's), tied embeddings by default and ``head_dim`` a key of its own."""

from __future__ import annotations

from torch import nn

from engine.models.config import ModelConfig
from engine.models.layers import SwiGLUMLP
from engine.models.llama import LlamaForCausalLM


def uses_bias(config: ModelConfig) -> bool:
    return bool(config.raw.get("use_bias", False))


class Ernie4_5ForCausalLM(LlamaForCausalLM):
    interleaved_rope = True

    @classmethod
    def attention_biases(cls, config: ModelConfig) -> tuple[bool, bool]:
        return uses_bias(config), uses_bias(config)

    @classmethod
    def make_mlp(cls, config: ModelConfig, layer_index: int) -> nn.Module:
        return SwiGLUMLP(config.hidden_size, config.intermediate_size, uses_bias(config), config.hidden_act)
