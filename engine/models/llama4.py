"""Llama 4 (``Llama4ForCausalLM``, and the language model of ``Llama4ForConditionalGeneration``): Scout, Maverick.

What differs from Llama (llama4_config.py reads the keys):
- RoPE turns interleaved pairs, and three layers in four attend within chunks of ``attention_chunk_size`` tokens
  with q and k L2-normalized after RoPE (no weight); the fourth has no RoPE, attends the whole context and scales
  its queries up with the position (temperature tuning). Chunked layers read the step's local-attention metadata
  (engine/runner/attention/local_attention.py: the batch cut into per-chunk virtual requests), the others the
  ordinary one. With the hybrid KV cache (engine/core/hybrid_kv_cache_manager.py) the chunked layers' groups hand
  back the blocks before each request's current chunk, and each group's virtual requests read its own table.
- Mixture-of-experts layers: a router picks the top-k experts, the sigmoid of each chosen logit scales that expert's
  *input*, and an ungated shared expert runs on every token; experts stored stacked in transformers' layout
  (``gate_up_proj`` [experts, hidden, 2 * width], ``down_proj`` [experts, width, hidden]). Other layers have a dense
  MLP of ``intermediate_size_mlp``.
- The checkpoint says ``feed_forward`` where Llama says ``mlp``; a multimodal checkpoint is served as its language
  model (multimodal_text.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.config import ModelConfig
from engine.models.layers import RMSNorm, SwiGLUMLP
from engine.models.llama import LlamaAttention, LlamaForCausalLM
from engine.models.llama4_config import Llama4Layers, llama4_layers
from engine.models.moe import rows_by_expert
from engine.models.rotary_embedding import RotaryEmbedding
from engine.runner.attention import AttentionBackend, AttentionMetadata, KVCache, get_attention_backend

class Llama4Experts(nn.Module):
    def __init__(self, num_experts: int, hidden_size: int, width: int) -> None:
        super().__init__()
        self.width = width
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, hidden_size, 2 * width))
        self.down_proj = nn.Parameter(torch.empty(num_experts, width, hidden_size))

    def forward(self, hidden_states: torch.Tensor, expert_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """Each expert once, on its rows scaled by their scores, in increasing id (transformers' order of sums)."""
        output = torch.zeros_like(hidden_states)
        for expert, tokens, token_scores in rows_by_expert(expert_ids, scores, self.gate_up_proj.shape[0]):
            gate, up = ((hidden_states[tokens] * token_scores[:, None]) @ self.gate_up_proj[expert]).split(
                self.width, dim=-1)
            output.index_add_(0, tokens, (up * F.silu(gate)) @ self.down_proj[expert])
        return output


class Llama4MoE(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        moe = config.moe
        self.top_k = moe.num_experts_per_token
        self.router = nn.Linear(config.hidden_size, moe.num_experts, bias=False)
        self.experts = Llama4Experts(moe.num_experts, config.hidden_size, moe.expert_intermediate_size)
        self.shared_expert = SwiGLUMLP(config.hidden_size, moe.shared_expert_intermediate_size, False, config.hidden_act)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        top_logits, expert_ids = self.router(hidden_states).topk(self.top_k, dim=-1)
        scores = torch.sigmoid(top_logits.float()).to(hidden_states.dtype)
        return self.shared_expert(hidden_states) + self.experts(hidden_states, expert_ids, scores)


def l2_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Each head's vector divided by its root mean square, in float32, with no weight."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class Llama4Attention(LlamaAttention):
    interleaved_rope = True

    def __init__(self, config: ModelConfig, backend: AttentionBackend, layers: Llama4Layers, uses_rope: bool) -> None:
        super().__init__(config, backend, config.attention_bias, config.attention_bias)
        self.use_rope = uses_rope
        self.chunked = uses_rope and layers.attention_chunk_size is not None
        self.l2_eps = config.rms_norm_eps if layers.qk_norm and uses_rope else None
        self.temperature_tuning = layers.temperature_tuning and not uses_rope
        self.floor_scale, self.attn_scale = layers.floor_scale, layers.attn_scale

    def forward(self, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: KVCache,
                attn_metadata: AttentionMetadata, positions: torch.Tensor | None = None) -> torch.Tensor:
        num_tokens = hidden_states.shape[0]
        q, k, v = self.qkv_proj(hidden_states).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.use_rope:
            q, k = self.rotate(q, cos, sin), self.rotate(k, cos, sin)
        if self.l2_eps is not None:
            q, k = l2_normalize(q, self.l2_eps), l2_normalize(k, self.l2_eps)
        if self.temperature_tuning:
            scales = torch.log1p(torch.floor((positions.float() + 1.0) / self.floor_scale)) * self.attn_scale + 1.0
            q = (q * scales[:, None, None]).to(q.dtype)
        if self.chunked:
            if attn_metadata.groups is not None:  # a hybrid KV cache: this layer's chunked group's virtual requests
                attn_metadata = attn_metadata.groups[kv_cache.group]
            attn_metadata = attn_metadata.local
            if attn_metadata is None:
                raise RuntimeError("Llama 4's chunked layers need the step's local-attention metadata "
                                   "(AttentionMetadata.local, built by the runner)")
        out = self.backend.forward(q, k, v.view(num_tokens, self.num_kv_heads, self.head_dim), kv_cache,
                                   attn_metadata, self.scale)
        return self.o_proj(out.reshape(num_tokens, self.q_size))


class Llama4DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, backend: AttentionBackend, layers: Llama4Layers, mlp: nn.Module,
                 uses_rope: bool) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Llama4Attention(config, backend, layers, uses_rope)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = mlp

    def forward(self, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: KVCache,
                attn_metadata: AttentionMetadata, positions: torch.Tensor) -> torch.Tensor:
        hidden_states = hidden_states + self.self_attn(self.input_layernorm(hidden_states), cos, sin, kv_cache,
                                                       attn_metadata, positions)
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class Llama4Model(nn.Module):
    def __init__(self, config: ModelConfig, backend: AttentionBackend, make_mlp) -> None:
        super().__init__()
        layers = llama4_layers(config.raw)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Llama4DecoderLayer(config, backend, layers, make_mlp(index), uses_rope)
                                    for index, uses_rope in enumerate(config.layer_uses_rope))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches, attn_metadata) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids)
        cos, sin = self.rotary_emb.cos_sin(positions, hidden_states.dtype)
        for layer, kv_cache in zip(self.layers, kv_caches):
            hidden_states = layer(hidden_states, cos, sin, kv_cache, attn_metadata, positions)
        return self.norm(hidden_states)


class Llama4ForCausalLM(LlamaForCausalLM):
    # The chunked layers' metadata is built per step on the host (AttentionMetadata.local), which a captured decode
    # graph would freeze. The virtual requests are ordinary ones to any backend; flash-attn's path is not yet run.
    cuda_graph_unsafe_reason = "chunked local attention builds its metadata per step"
    unsupported_attention_backends = {"flash_attn": "chunked local attention has not been run on flash-attn yet"}

    def __init__(self, config: ModelConfig, attention_backend: str | AttentionBackend = "torch") -> None:
        nn.Module.__init__(self)
        self.check_config(config)
        self.config = config
        self.attention_chunk_size = llama4_layers(config.raw).attention_chunk_size
        backend = get_attention_backend(attention_backend, self.unsupported_attention_backends)
        self.model = Llama4Model(config, backend, lambda index: self.make_mlp(config, index))
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(config.hidden_size, config.vocab_size,
                                                                          bias=False)

    @classmethod
    def make_mlp(cls, config: ModelConfig, layer_index: int) -> nn.Module:
        if layer_index in config.moe.dense_layers:
            return SwiGLUMLP(config.hidden_size, llama4_layers(config.raw).dense_mlp_size, False, config.hidden_act)
        return Llama4MoE(config)

    def _map_weight_name(self, name: str) -> tuple[str, str | None]:
        return super()._map_weight_name(name.replace(".feed_forward.", ".mlp."))
