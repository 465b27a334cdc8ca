"""Multi-head latent attention (MLA, DeepSeek-V2/V3) over the paged cache, in its absorbed form.

Each token caches ``c = [norm(latent), rope(k_rope)]``: ``kv_lora_rank + qk_rope_head_dim`` features, one "KV head"
for all query heads (``ModelConfig.mla``). Head ``h``'s key is ``[W_UK[h] @ latent, k_rope]`` and its value
``W_UV[h] @ latent``, with ``W_UK`` and ``W_UV`` the two parts of ``kv_b_proj``. Rather than expanding every
cached latent into per-head keys and values each step, the projections are moved onto the query and the
output (as vLLM's MLA backends do for decodes, and as DeepSeek's paper describes):

    q[h] . k[h] = (W_UK[h]^T q_nope[h]) . latent + q_rope[h] . k_rope     (the query "absorbs" W_UK)
    sum_j p_j v_j[h] = W_UV[h] (sum_j p_j latent_j)                      (W_UV applied once, after)

So a head's query becomes ``[W_UK[h]^T q_nope[h], q_rope[h]]``, as wide as ``c``, and attention is plain
multi-query attention over the cached ``c``, its values being the same vectors (the backend gets the one
cache tensor as keys and as values; the features past the latent in its output are dropped). The result is
the expanded form's up to float rounding; tests compare it with transformers, which expands.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.models.config import ModelConfig
from engine.models.layers import RMSNorm
from engine.models.rotary_embedding import RotaryEmbedding
from engine.runner.attention import AttentionBackend, AttentionMetadata, KVCache

# transformers' DeepSeek models build the two low-rank norms with RMSNorm's default epsilon, not rms_norm_eps.
LOW_RANK_NORM_EPS = 1e-6


class MultiHeadLatentAttention(nn.Module):
    def __init__(self, config: ModelConfig, backend: AttentionBackend) -> None:
        super().__init__()
        mla = config.mla
        self.num_heads = config.num_attention_heads
        self.qk_nope_head_dim, self.qk_rope_head_dim = mla.qk_nope_head_dim, mla.qk_rope_head_dim
        self.kv_lora_rank, self.v_head_dim = mla.kv_lora_rank, mla.v_head_dim
        self.rope_interleave = mla.rope_interleave
        self.scale = mla.softmax_scale
        self.q_lora_rank = mla.q_lora_rank
        query_width = self.num_heads * mla.qk_head_dim
        if mla.q_lora_rank is None:
            self.q_proj = nn.Linear(config.hidden_size, query_width, bias=False)
        else:
            self.q_a_proj = nn.Linear(config.hidden_size, mla.q_lora_rank, bias=config.attention_bias)
            self.q_a_layernorm = RMSNorm(mla.q_lora_rank, LOW_RANK_NORM_EPS)
            self.q_b_proj = nn.Linear(mla.q_lora_rank, query_width, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(config.hidden_size, mla.cache_width, bias=config.attention_bias)
        self.kv_a_layernorm = RMSNorm(mla.kv_lora_rank, LOW_RANK_NORM_EPS)
        self.kv_b_proj = nn.Linear(mla.kv_lora_rank, self.num_heads * (mla.qk_nope_head_dim + mla.v_head_dim),
                                   bias=False)
        self.o_proj = nn.Linear(self.num_heads * mla.v_head_dim, config.hidden_size, bias=config.attention_bias)
        self.backend = backend

    def _queries(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.q_lora_rank is None:
            return self.q_proj(hidden_states)
        return self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """RoPE over the last dimension. Interleaved: pair (x[2i], x[2i+1]) turns by angle i, and the result is
        laid out as the turned evens then the turned odds (transformers' layout); queries and keys get the same
        layout, so their dot products are the pairs' own."""
        if not self.rope_interleave:
            return RotaryEmbedding.apply(x, cos, sin)
        half = x.shape[-1] // 2
        cos, sin = cos[..., :half], sin[..., :half]  # cos/sin repeat their angles over the two halves
        evens, odds = x[..., 0::2], x[..., 1::2]
        return torch.cat((evens * cos - odds * sin, odds * cos + evens * sin), dim=-1)

    def forward(self, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: KVCache,
                attn_metadata: AttentionMetadata) -> torch.Tensor:
        num_tokens = hidden_states.shape[0]
        query = self._queries(hidden_states).view(num_tokens, self.num_heads, -1)
        query_nope, query_rope = query.split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        latent, key_rope = self.kv_a_proj_with_mqa(hidden_states).split([self.kv_lora_rank, self.qk_rope_head_dim],
                                                                        dim=-1)
        cached = torch.cat((self.kv_a_layernorm(latent), self._rotate(key_rope[:, None, :], cos, sin)[:, 0]), dim=-1)

        # [H, nope + v, rank] -> the key part W_UK [H, nope, rank] and the value part W_UV [H, v, rank].
        up_projection = self.kv_b_proj.weight.view(self.num_heads, -1, self.kv_lora_rank)
        key_up, value_up = up_projection.split([self.qk_nope_head_dim, self.v_head_dim], dim=1)
        absorbed = torch.bmm(query_nope.transpose(0, 1), key_up).transpose(0, 1)  # [T, H, rank]
        query = torch.cat((absorbed, self._rotate(query_rope, cos, sin)), dim=-1)  # [T, H, rank + rope]

        cached = cached[:, None, :]  # [T, 1, rank + rope]: the one KV head
        output = self.backend.forward(query, cached, cached, kv_cache, attn_metadata, self.scale)
        latent_output = output[..., :self.kv_lora_rank]  # [T, H, rank]; the rope features' sums are not values
        values = torch.bmm(latent_output.transpose(0, 1), value_up.transpose(1, 2)).transpose(0, 1)  # [T, H, v]
        return self.o_proj(values.reshape(num_tokens, self.num_heads * self.v_head_dim))
