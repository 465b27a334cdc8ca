"""Gemma 2 (``Gemma2ForCausalLM``) and Gemma 3's text model (``Gemma3ForCausalLM``: gemma-3-1b, and the text
towers of the larger ones saved alone).

Where they differ from the Llama layers they reuse (fused q/k/v and gate/up projections, the paged attention
backends, weight loading):

* embeddings scaled by sqrt(hidden_size), the factor rounded to the weights' dtype first, as transformers does;
* every RMSNorm multiplies by ``1 + weight`` in float32 before casting back (Llama casts, then multiplies):
  around each attention and MLP block (input, post-attention, pre- and post-feedforward norms), at the end,
  and in Gemma 3 on each head's q and k before RoPE;
* a gated MLP with tanh-approximated GELU (``gelu_pytorch_tanh``);
* attention scaled by ``query_pre_attn_scalar ** -0.5`` instead of ``head_dim ** -0.5``;
* local layers attend a sliding window (every other layer in Gemma 2, five of six in Gemma 3, which gives them
  their own RoPE base ``rope_local_base_freq``), global layers the full context with ``rope_theta`` and its
  scaling (gemma_config.py reads which layer is which);
* tanh caps: on attention scores (Gemma 2's ``attn_logit_softcapping``, 50, applied by the attention backend)
  and on the final logits (``final_logit_softcapping``: Gemma 2's 30; null in Gemma 3's checkpoints).

Bidirectional attention (an embedding variant) is refused at load.
Only some layers slide, so the KV-cache manager keeps every block (as vLLM does without its hybrid allocator):
the windows save attention work, not memory.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from engine.models.config import ModelConfig
from engine.models.gemma_config import gemma_soft_caps
from engine.models.layers import SwiGLUMLP
from engine.models.llama import LlamaAttention, LlamaForCausalLM
from engine.models.rotary_embedding import RotaryEmbedding, cos_sin_per_layer
from engine.runner.attention import AttentionBackend, AttentionMetadata, KVCache, get_attention_backend


class GemmaRMSNorm(nn.Module):
    """x / rms(x) * (1 + weight), computed in float32 and cast back once (transformers' Gemma3RMSNorm)."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.to(torch.float32)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.to(torch.float32))).to(x.dtype)


class GemmaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, backend: AttentionBackend, sliding_window: int | None, qk_norm: bool,
                 attention_soft_cap: float | None) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = LlamaAttention(config, backend, config.attention_bias, config.attention_bias, qk_norm=qk_norm,
                                        sliding_window=sliding_window, logits_soft_cap=attention_soft_cap)
        if qk_norm:
            self.self_attn.q_norm = GemmaRMSNorm(config.head_dim, eps)
            self.self_attn.k_norm = GemmaRMSNorm(config.head_dim, eps)
        self.self_attn.scale = float(config.raw.get("query_pre_attn_scalar", 256)) ** -0.5
        self.mlp = SwiGLUMLP(hidden, config.intermediate_size, False, config.hidden_act)  # tanh-GELU gate
        self.input_layernorm = GemmaRMSNorm(hidden, eps)
        self.post_attention_layernorm = GemmaRMSNorm(hidden, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(hidden, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(hidden, eps)

    def forward(self, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: KVCache,
                attn_metadata: AttentionMetadata) -> torch.Tensor:
        attended = self.self_attn(self.input_layernorm(hidden_states), cos, sin, kv_cache, attn_metadata)
        hidden_states = hidden_states + self.post_attention_layernorm(attended)
        return hidden_states + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(hidden_states)))


class GemmaModel(nn.Module):
    def __init__(self, config: ModelConfig, backend: AttentionBackend, qk_norm: bool,
                 attention_soft_cap: float | None) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.embed_scale = config.hidden_size ** 0.5
        self.layers = nn.ModuleList(GemmaDecoderLayer(config, backend, config.layer_sliding_windows[index], qk_norm,
                                                      attention_soft_cap)
                                    for index in range(config.num_hidden_layers))
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.global_rotary_emb = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling)
        # Gemma 3's local layers turn at their own base; Gemma 2's every layer at rope_theta.
        self.local_rotary_emb = (self.global_rotary_emb if config.local_rope_theta is None
                                 else RotaryEmbedding(config.head_dim, config.local_rope_theta, None))

    def scaled_embeddings(self, input_ids: torch.Tensor) -> torch.Tensor:
        embeddings = self.embed_tokens(input_ids)
        # The factor in the weights' dtype first (bfloat16 rounds sqrt(1152) to 34.0), as transformers multiplies.
        return embeddings * torch.tensor(self.embed_scale, dtype=embeddings.dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: Sequence[KVCache],
                attn_metadata: AttentionMetadata, inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        """``inputs_embeds``: the scaled token embeddings with images' (unscaled, as transformers puts them) in their
        placeholders' rows; None: ``input_ids``' scaled embeddings."""
        if len(kv_caches) != len(self.layers):
            raise ValueError(f"got {len(kv_caches)} kv caches for {len(self.layers)} layers")
        hidden_states = self.scaled_embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        cos_sin = cos_sin_per_layer(self.global_rotary_emb, self.local_rotary_emb, self.layers, positions,
                                    hidden_states.dtype)
        for layer, kv_cache, (cos, sin) in zip(self.layers, kv_caches, cos_sin):
            hidden_states = layer(hidden_states, cos, sin, kv_cache, attn_metadata)
        return self.norm(hidden_states)


class GemmaForCausalLM(LlamaForCausalLM):
    """Gemma 2 or 3 as the config's model_type says (qk norms: Gemma 3's only)."""

    def __init__(self, config: ModelConfig, attention_backend: str | AttentionBackend = "torch") -> None:
        nn.Module.__init__(self)
        self.check_config(config)
        self.config = config
        attention_soft_cap, self.final_logit_softcapping = gemma_soft_caps(config.raw, config.model_type)
        self.model = GemmaModel(config, get_attention_backend(attention_backend),
                                qk_norm=config.model_type == "gemma3_text", attention_soft_cap=attention_soft_cap)
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(config.hidden_size, config.vocab_size,
                                                                          bias=False)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.scaled_embeddings(input_ids)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = super().compute_logits(hidden_states)
        cap = self.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits


class Gemma2ForCausalLM(GemmaForCausalLM):
    pass


class Gemma3ForCausalLM(GemmaForCausalLM):
    pass
