"""Seed-OSS (``SeedOssForCausalLM``: ByteDance's Seed-OSS-36B): the Llama architecture with its own switches for the
biases, ``attention_bias`` on q, k and v (true by default) and ``attention_out_bias`` on the output projection
(false by default), ``mlp_bias`` on the MLP; ``head_dim`` a key of its own (128 beside a 5,120 width)."""

from __future__ import annotations

from engine.models.config import ModelConfig
from engine.models.llama import LlamaForCausalLM


class SeedOssForCausalLM(LlamaForCausalLM):
    @classmethod
    def attention_biases(cls, config: ModelConfig) -> tuple[bool, bool]:
        return config.attention_bias, bool(config.raw.get("attention_out_bias", False))
