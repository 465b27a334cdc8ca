"""OLMo 2 (``Olmo2ForCausalLM``, AI2's fully open models): Llama's projections and MLP with the norms moved.

* No norm before attention or the MLP; each block's *output* is RMS-normalized before the residual add
  (``post_attention_layernorm``, ``post_feedforward_layernorm``).
* q and k are RMS-normalized over the whole projection (``q_norm`` [num_heads * head_dim], ``k_norm``
  [num_kv_heads * head_dim]), before RoPE, where Qwen3 normalizes each head apart.

OLMo 3 (``Olmo3ForCausalLM``) is the same model with three layers in four attending a sliding window, which turn by
plain RoPE while the full layers take the checkpoint's scaling (olmo3_config.py); on vLLM's hybrid KV cache.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from engine.models.config import ModelConfig
from engine.models.layers import RMSNorm
from engine.models.llama import LlamaAttention, LlamaForCausalLM, LlamaModel
from engine.models.rotary_embedding import RotaryEmbedding, cos_sin_per_layer
from engine.runner.attention import AttentionBackend, AttentionMetadata, KVCache, get_attention_backend


class Olmo2Attention(LlamaAttention):
    def __init__(self, config: ModelConfig, backend: AttentionBackend, sliding_window: int | None = None) -> None:
        super().__init__(config, backend, config.attention_bias, config.attention_bias, sliding_window=sliding_window)
        self.q_norm = RMSNorm(self.q_size, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.kv_size, config.rms_norm_eps)

    def forward(self, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: KVCache,
                attn_metadata: AttentionMetadata) -> torch.Tensor:
        num_tokens = hidden_states.shape[0]
        q, k, v = self.qkv_proj(hidden_states).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = self.rotate(self.q_norm(q).view(num_tokens, self.num_heads, self.head_dim), cos, sin)
        k = self.rotate(self.k_norm(k).view(num_tokens, self.num_kv_heads, self.head_dim), cos, sin)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        out = self.backend.forward(q, k, v, kv_cache, attn_metadata, self.scale, self.sliding_window)
        return self.o_proj(out.reshape(num_tokens, self.q_size))


class Olmo2DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, backend: AttentionBackend, mlp: nn.Module,
                 sliding_window: int | None = None) -> None:
        super().__init__()
        self.self_attn = Olmo2Attention(config, backend, sliding_window)
        self.mlp = mlp
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: KVCache,
                attn_metadata: AttentionMetadata) -> torch.Tensor:
        attended = self.self_attn(hidden_states, cos, sin, kv_cache, attn_metadata)
        hidden_states = hidden_states + self.post_attention_layernorm(attended)
        return hidden_states + self.post_feedforward_layernorm(self.mlp(hidden_states))


class Olmo2Model(LlamaModel):
    """Llama's stack (its forward) with OLMo 2's layers."""

    def __init__(self, config: ModelConfig, backend: AttentionBackend, make_mlp) -> None:
        super().__init__(config, backend, False, False, make_mlp, make_layer=lambda index: Olmo2DecoderLayer(
            config, backend, make_mlp(index), config.layer_sliding_windows[index]))
        # OLMo 3's sliding layers turn unscaled (local_rope_theta); OLMo 2's every layer by rotary_emb.
        self.local_rotary_emb = (self.rotary_emb if config.local_rope_theta is None
                                 else RotaryEmbedding(config.rotary_dim, config.local_rope_theta, None))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: Sequence[KVCache],
                attn_metadata: AttentionMetadata) -> torch.Tensor:
        if self.local_rotary_emb is self.rotary_emb:
            return super().forward(input_ids, positions, kv_caches, attn_metadata)
        if len(kv_caches) != len(self.layers):
            raise ValueError(f"got {len(kv_caches)} kv caches for {len(self.layers)} layers")
        hidden_states = self.embed_tokens(input_ids)
        cos_sin = cos_sin_per_layer(self.rotary_emb, self.local_rotary_emb, self.layers, positions, hidden_states.dtype)
        for layer, kv_cache, (cos, sin) in zip(self.layers, kv_caches, cos_sin):
            hidden_states = layer(hidden_states, cos, sin, kv_cache, attn_metadata)
        return self.norm(hidden_states)


class Olmo2ForCausalLM(LlamaForCausalLM):
    def __init__(self, config: ModelConfig, attention_backend: str | AttentionBackend = "torch") -> None:
        nn.Module.__init__(self)
        self.check_config(config)
        self.config = config
        self.model = Olmo2Model(config, get_attention_backend(attention_backend),
                                lambda layer_index: self.make_mlp(config, layer_index))
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(config.hidden_size, config.vocab_size,
                                                                          bias=False)


class Olmo3ForCausalLM(Olmo2ForCausalLM):
    """OLMo 3: OLMo 2's weights and layers; the config gives three layers in four a window (module docstring)."""
