"""IBM Granite (``GraniteForCausalLM``: Granite 3.x dense models): Llama's layers with four scalars from the
config, applied where transformers applies them:

* ``embedding_multiplier``: the token embeddings are multiplied by it;
* ``attention_multiplier``: the attention's softmax scale, in place of 1 / sqrt(head_dim);
* ``residual_multiplier``: each attention and MLP output is multiplied by it before the residual add;
* ``logits_scaling``: the logits are divided by it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from engine.models.config import ModelConfig
from engine.models.granite_config import granite_multipliers
from engine.models.llama import LlamaForCausalLM, LlamaModel
from engine.runner.attention import AttentionBackend, AttentionMetadata, KVCache, get_attention_backend

class GraniteModel(LlamaModel):
    """Llama's stack; its forward scales the embeddings and each residual branch."""

    embedding_multiplier = 1.0
    residual_multiplier = 1.0

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: Sequence[KVCache],
                attn_metadata: AttentionMetadata) -> torch.Tensor:
        if len(kv_caches) != len(self.layers):
            raise ValueError(f"got {len(kv_caches)} kv caches for {len(self.layers)} layers")
        hidden_states = self.embed_tokens(input_ids) * self.embedding_multiplier
        cos, sin = self.rotary_emb.cos_sin(positions, hidden_states.dtype)
        for layer, kv_cache in zip(self.layers, kv_caches):
            attended = layer.self_attn(layer.input_layernorm(hidden_states), cos, sin, kv_cache, attn_metadata)
            hidden_states = hidden_states + attended * self.residual_multiplier
            hidden_states = hidden_states + layer.mlp(layer.post_attention_layernorm(hidden_states)) * self.residual_multiplier
        return self.norm(hidden_states)


class GraniteForCausalLM(LlamaForCausalLM):
    def __init__(self, config: ModelConfig, attention_backend: str | AttentionBackend = "torch") -> None:
        nn.Module.__init__(self)
        self.check_config(config)
        self.config = config
        multipliers = granite_multipliers(config.raw)
        self.model = GraniteModel(config, get_attention_backend(attention_backend), *self.attention_biases(config),
                                  make_mlp=lambda layer_index: self.make_mlp(config, layer_index))
        self.model.embedding_multiplier = multipliers["embedding_multiplier"]
        self.model.residual_multiplier = multipliers["residual_multiplier"]
        for layer in self.model.layers:
            layer.self_attn.scale = multipliers["attention_multiplier"]
        self.logits_scaling = multipliers["logits_scaling"]
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(config.hidden_size, config.vocab_size,
                                                                          bias=False)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return super().compute_logits(hidden_states) / self.logits_scaling
