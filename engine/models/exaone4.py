"""EXAONE 4.0 (``Exaone4ForCausalLM``: LG AI Research's 1.2B and 32B): OLMo 2's block (no norm before attention or
the MLP, each block's output RMS-normalized before the residual add) with Qwen3's per-head q/k RMSNorms, and, on the
32B model, three sliding-window layers with RoPE to one full-attention layer without (nope_layers.py), on vLLM's
hybrid KV cache."""

from __future__ import annotations

from torch import nn

from engine.models.config import ModelConfig
from engine.models.layers import RMSNorm
from engine.models.llama import LlamaAttention, LlamaForCausalLM
from engine.models.olmo2 import Olmo2DecoderLayer
from engine.runner.attention import AttentionBackend


class Exaone4DecoderLayer(Olmo2DecoderLayer):
    """OLMo 2's block (its forward) around Llama's attention with per-head q/k norms and no biases."""

    def __init__(self, config: ModelConfig, backend: AttentionBackend, mlp: nn.Module,
                 sliding_window: int | None) -> None:
        nn.Module.__init__(self)
        self.self_attn = LlamaAttention(config, backend, False, False, qk_norm=True, sliding_window=sliding_window)
        self.mlp = mlp
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class Exaone4ForCausalLM(LlamaForCausalLM):
    qk_norm = True  # per head, as Qwen3's (checkpoint_shapes reads it)

    def make_layer(self, config: ModelConfig, backend: AttentionBackend, layer_index: int) -> nn.Module:
        return Exaone4DecoderLayer(config, backend, self.make_mlp(config, layer_index),
                                   config.layer_sliding_windows[layer_index])
