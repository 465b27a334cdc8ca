"""EXAONE 4.0 (``Exaone4ForCausalLM``: LG AI Research's 1.2B and 32B): OLMo 2's block (no norm before attention or
the MLP, each block's output RMS-normalized before the residual add) with Qwen3's per-head q/k RMSNorms, and, on the
32B model, three sliding-window layers with RoPE to one full-attention layer without (nope_layers.py), on vLLM's
hybrid KV cache."""

from __future__ import annotations

from torch import nn

from engine.models.config import ModelConfig
from engine.models.layers import RMSNorm
from engine.models.llama import LlamaAttention, LlamaForCausalLM, LlamaModel
from engine.models.olmo2 import Olmo2DecoderLayer
from engine.models.rotary_embedding import RotaryEmbedding
from engine.runner.attention import AttentionBackend, get_attention_backend


class Exaone4DecoderLayer(Olmo2DecoderLayer):
    """OLMo 2's block (its forward) around Llama's attention with per-head q/k norms and no biases."""

    def __init__(self, config: ModelConfig, backend: AttentionBackend, mlp: nn.Module,
                 sliding_window: int | None) -> None:
        nn.Module.__init__(self)
        self.self_attn = LlamaAttention(config, backend, False, False, qk_norm=True, sliding_window=sliding_window)
        self.mlp = mlp
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class Exaone4Model(LlamaModel):
    """Llama's stack (its forward: one cos/sin, skipped by the layers without RoPE) with EXAONE 4's layers."""

    def __init__(self, config: ModelConfig, backend: AttentionBackend, make_mlp) -> None:
        nn.Module.__init__(self)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Exaone4DecoderLayer(config, backend, make_mlp(index),
                                                        config.layer_sliding_windows[index])
                                    for index in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config.rotary_dim, config.rope_theta, config.rope_scaling)
        for layer, uses_rope in zip(self.layers, config.layer_uses_rope):
            layer.self_attn.use_rope = uses_rope


class Exaone4ForCausalLM(LlamaForCausalLM):
    qk_norm = True  # per head, as Qwen3's (checkpoint_shapes reads it)

    def __init__(self, config: ModelConfig, attention_backend: str | AttentionBackend = "torch") -> None:
        nn.Module.__init__(self)
        self.check_config(config)
        self.config = config
        self.model = Exaone4Model(config, get_attention_backend(attention_backend),
                                  lambda layer_index: self.make_mlp(config, layer_index))
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(config.hidden_size, config.vocab_size,
                                                                          bias=False)
