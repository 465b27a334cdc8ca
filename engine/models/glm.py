"""GLM-4 (``GlmForCausalLM``: glm-4-9b-chat-hf) and GLM-4-0414 (``Glm4ForCausalLM``: GLM-4-9B/32B-0414, GLM-Z1).

What differs from Llama:
- RoPE on the first ``partial_rotary_factor`` (0.5) of each head, turning interleaved pairs (features 2i and 2i+1
  together), the rest of the head passing unturned;
- biases on q, k and v, none on the output projection;
- the MLP's gate and up projections stored fused (``mlp.gate_up_proj`` [gate; up], Phi-3's layout);
- GLM-4-0414 normalizes each block's output too (``post_self_attn_layernorm``, ``post_mlp_layernorm``) before the
  residual add, besides the usual norms before each block.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.models.config import ModelConfig
from engine.models.layers import RMSNorm
from engine.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM
from engine.runner.attention import AttentionBackend, AttentionMetadata, KVCache


class GlmAttention(LlamaAttention):
    interleaved_rope = True  # over the first rotary_dim features (rotate_pairs)

    def __init__(self, config: ModelConfig, backend: AttentionBackend) -> None:
        super().__init__(config, backend, config.attention_bias, False)


class GlmDecoderLayer(LlamaDecoderLayer):
    """Llama's layer with GLM's attention; ``post_block_norms``: GLM-4-0414's norms on each block's output."""

    def __init__(self, config: ModelConfig, backend: AttentionBackend, mlp: nn.Module, post_block_norms: bool) -> None:
        nn.Module.__init__(self)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = GlmAttention(config, backend)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = mlp
        self.post_self_attn_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps) if post_block_norms else None
        self.post_mlp_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps) if post_block_norms else None

    def forward(self, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: KVCache,
                attn_metadata: AttentionMetadata) -> torch.Tensor:
        attended = self.self_attn(self.input_layernorm(hidden_states), cos, sin, kv_cache, attn_metadata)
        if self.post_self_attn_layernorm is not None:
            attended = self.post_self_attn_layernorm(attended)
        hidden_states = hidden_states + attended
        transformed = self.mlp(self.post_attention_layernorm(hidden_states))
        if self.post_mlp_layernorm is not None:
            transformed = self.post_mlp_layernorm(transformed)
        return hidden_states + transformed


class GlmForCausalLM(LlamaForCausalLM):
    # q, k and v are separate tensors in the checkpoint; gate and up come fused, as our parameter is.
    stacked_params = {name: target for name, target in LlamaForCausalLM.stacked_params.items()
                      if target[0] == "qkv_proj"}
    post_block_norms = False

    def make_layer(self, config: ModelConfig, backend: AttentionBackend, layer_index: int) -> nn.Module:
        return GlmDecoderLayer(config, backend, self.make_mlp(config, layer_index), self.post_block_norms)

    def expected_weight_keys(self) -> set[str]:
        return {key.partition("#")[0] if ".gate_up_proj." in key else key for key in super().expected_weight_keys()}


class Glm4ForCausalLM(GlmForCausalLM):
    post_block_norms = True
