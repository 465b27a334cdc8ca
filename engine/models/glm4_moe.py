"""GLM-4.5 and GLM-4.5-Air (``Glm4MoeForCausalLM``): Llama's grouped-query attention (biases on q, k and v;
RoPE on the first half of each head by default; per-head q/k RMSNorms with ``use_qk_norm``) and DeepSeek-V3's
mixture of experts (sigmoid router with a correction bias, expert groups, shared experts, dense first layers:
deepseek.py), the checkpoint's multi-token-prediction layer skipped as transformers skips it."""

from __future__ import annotations

from torch import nn

from engine.models.config import ModelConfig
from engine.models.deepseek import DeepseekV2ForCausalLM
from engine.models.llama import LlamaForCausalLM, LlamaModel
from engine.runner.attention import AttentionBackend, get_attention_backend


class Glm4MoeForCausalLM(DeepseekV2ForCausalLM):
    stacked_params = LlamaForCausalLM.stacked_params  # q/k/v and gate/up are fused, as for Llama
    unsupported_attention_backends: dict[str, str] = {}  # grouped-query attention: every backend runs it

    def __init__(self, config: ModelConfig, attention_backend: str | AttentionBackend = "torch") -> None:
        nn.Module.__init__(self)
        self.check_config(config)
        self.config = config
        self.model = LlamaModel(config, get_attention_backend(attention_backend), config.attention_bias, False,
                                make_mlp=lambda layer_index: self.make_mlp(config, layer_index),
                                qk_norm=bool(config.raw.get("use_qk_norm")))
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(config.hidden_size, config.vocab_size,
                                                                          bias=False)

    @classmethod
    def check_config(cls, config: ModelConfig) -> None:
        if config.moe is None or config.moe.deepseek_routing is None:
            raise ValueError(f"Glm4MoeForCausalLM needs a glm4_moe config, got model_type {config.model_type!r}")
