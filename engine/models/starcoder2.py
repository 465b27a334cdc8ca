"""StarCoder2 (``Starcoder2ForCausalLM``: the BigCode code models) on Llama's attention, as transformers computes it:

* biases on every projection (``use_bias``, default true): q, k, v, o and the MLP's two;
* LayerNorms with a bias (``norm_epsilon``) where Llama has RMSNorms;
* a plain MLP, ``c_proj(gelu_tanh(c_fc(x)))``, not a gated one;
* a ``sliding_window`` on every layer when the config sets one; embeddings tied by default.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.models.config import ModelConfig
from engine.models.layers import GATE_ACTIVATIONS
from engine.models.llama import LlamaForCausalLM
from engine.runner.attention import AttentionBackend


class Starcoder2MLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool, hidden_act: str) -> None:
        super().__init__()
        if hidden_act not in GATE_ACTIVATIONS:
            raise ValueError(f"unsupported hidden_act {hidden_act!r}; supported: {', '.join(GATE_ACTIVATIONS)}")
        self.activation = GATE_ACTIVATIONS[hidden_act]
        self.c_fc = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.c_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.activation(self.c_fc(x)))


class Starcoder2ForCausalLM(LlamaForCausalLM):
    def __init__(self, config: ModelConfig, attention_backend: str | AttentionBackend = "torch") -> None:
        super().__init__(config, attention_backend)
        eps = float(config.raw.get("norm_epsilon", 1e-5))
        for layer in self.model.layers:  # LayerNorms, with biases, in place of Llama's RMSNorms
            layer.input_layernorm = nn.LayerNorm(config.hidden_size, eps=eps)
            layer.post_attention_layernorm = nn.LayerNorm(config.hidden_size, eps=eps)
        self.model.norm = nn.LayerNorm(config.hidden_size, eps=eps)

    @classmethod
    def attention_biases(cls, config: ModelConfig) -> tuple[bool, bool]:
        bias = bool(config.raw.get("use_bias", True))
        return bias, bias

    @classmethod
    def make_mlp(cls, config: ModelConfig, layer_index: int) -> nn.Module:
        return Starcoder2MLP(config.hidden_size, config.intermediate_size, bool(config.raw.get("use_bias", True)),
                             config.hidden_act)
