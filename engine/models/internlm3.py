"""InternLM3 (``InternLM3ForCausalLM``: internlm3-8b-instruct), which transformers runs as Llama: one bias switch for
q, k, v and the output projection, spelled ``qkv_bias`` in the published config (``attention_bias`` as transformers 5
writes it), and one for the MLP, ``bias`` (``mlp_bias``); ``head_dim`` a key of its own."""

from __future__ import annotations

from torch import nn

from engine.models.config import ModelConfig
from engine.models.layers import SwiGLUMLP
from engine.models.llama import LlamaForCausalLM


def _switch(config: ModelConfig, published: str, written: str) -> bool:
    return bool(config.raw.get(published, config.raw.get(written, False)))


class InternLM3ForCausalLM(LlamaForCausalLM):
    @classmethod
    def attention_biases(cls, config: ModelConfig) -> tuple[bool, bool]:
        bias = _switch(config, "qkv_bias", "attention_bias")
        return bias, bias

    @classmethod
    def make_mlp(cls, config: ModelConfig, layer_index: int) -> nn.Module:
        return SwiGLUMLP(config.hidden_size, config.intermediate_size, _switch(config, "bias", "mlp_bias"),
                         config.hidden_act)
