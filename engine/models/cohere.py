"""Cohere Command-R (``CohereForCausalLM``: Command-R, Command-R+, Aya-23): Llama's projections in a different
block, as transformers' Cohere model computes it:

* one LayerNorm (mean subtracted, a weight and no bias, in float32) before each layer, whose output feeds
  attention and the MLP *in parallel*: ``h + attention(norm(h)) + mlp(norm(h))``; the same LayerNorm at the end;
* RoPE on interleaved pairs (features 2i and 2i+1 turn together), computed in float32;
* optional LayerNorms on q and k per head (``use_qk_norm``, Command-R+), weights [heads, head_dim];
* logits multiplied by ``logit_scale``; embeddings tied by default.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.models.config import ModelConfig
from engine.models.llama import LlamaAttention, LlamaForCausalLM, LlamaModel
from engine.models.rotary_embedding import RotaryEmbedding
from engine.runner.attention import AttentionBackend, AttentionMetadata, KVCache, get_attention_backend


class CohereLayerNorm(nn.Module):
    """(x - mean) / sqrt(var + eps) * weight over the last dimension(s) of ``shape``, in float32, cast back once."""

    def __init__(self, shape: int | tuple[int, ...], eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(shape))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.to(torch.float32)
        centred = x32 - x32.mean(-1, keepdim=True)
        normalized = centred * torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.to(torch.float32) * normalized).to(x.dtype)


class CohereAttention(LlamaAttention):
    def __init__(self, config: ModelConfig, backend: AttentionBackend, eps: float) -> None:
        super().__init__(config, backend, config.attention_bias, config.attention_bias)
        if config.raw.get("use_qk_norm"):
            self.q_norm = CohereLayerNorm((self.num_heads, self.head_dim), eps)
            self.k_norm = CohereLayerNorm((self.num_kv_heads, self.head_dim), eps)

    # RoPE on interleaved pairs (LlamaAttention.rotate); Cohere2's full-attention layers skip it (use_rope).
    interleaved_rope = True


class CohereDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, backend: AttentionBackend, mlp: nn.Module, eps: float) -> None:
        super().__init__()
        self.input_layernorm = CohereLayerNorm(config.hidden_size, eps)
        self.self_attn = CohereAttention(config, backend, eps)
        self.mlp = mlp

    def forward(self, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: KVCache,
                attn_metadata: AttentionMetadata) -> torch.Tensor:
        normalized = self.input_layernorm(hidden_states)
        attended = self.self_attn(normalized, cos, sin, kv_cache, attn_metadata)
        return hidden_states + attended + self.mlp(normalized)


class CohereModel(LlamaModel):
    """Llama's stack (its forward) with Cohere's layers and final LayerNorm."""

    def __init__(self, config: ModelConfig, backend: AttentionBackend, make_mlp, eps: float) -> None:
        nn.Module.__init__(self)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(CohereDecoderLayer(config, backend, make_mlp(index), eps)
                                    for index in range(config.num_hidden_layers))
        self.norm = CohereLayerNorm(config.hidden_size, eps)
        self.rotary_emb = RotaryEmbedding(config.rotary_dim, config.rope_theta, config.rope_scaling)
        for layer, uses_rope, window in zip(self.layers, config.layer_uses_rope, config.layer_sliding_windows):
            layer.self_attn.use_rope, layer.self_attn.sliding_window = uses_rope, window


class CohereForCausalLM(LlamaForCausalLM):
    """Command-R; and Command-R7B / Command-A (``Cohere2ForCausalLM``), whose windowed layers alone use RoPE
    (``ModelConfig.layer_uses_rope``, nope_layers.py)."""

    def __init__(self, config: ModelConfig, attention_backend: str | AttentionBackend = "torch") -> None:
        nn.Module.__init__(self)
        self.check_config(config)
        self.config = config
        eps = float(config.raw.get("layer_norm_eps") or 1e-5)
        self.model = CohereModel(config, get_attention_backend(attention_backend),
                                 lambda layer_index: self.make_mlp(config, layer_index), eps)
        logit_scale = config.raw.get("logit_scale", 0.0625)
        self.logit_scale = 1.0 if logit_scale is None else float(logit_scale)
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(config.hidden_size, config.vocab_size,
                                                                          bias=False)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return super().compute_logits(hidden_states) * self.logit_scale


class Cohere2ForCausalLM(CohereForCausalLM):
    pass
