"""Phi-3 and Phi-4 (``Phi3ForCausalLM``): the Llama architecture, its checkpoints already fused.

A Phi-3 checkpoint stores ``self_attn.qkv_proj`` ([q; k; v] rows) and ``mlp.gate_up_proj`` ([gate; up] rows) as
single tensors, the very layout of our fused parameters, so they load whole. A ``sliding_window`` applies to
every layer, as transformers applies it (Phi-3-mini-4k's 2047); ``partial_rotary_factor`` turns only the first
features of each head (``ModelConfig.rotary_dim``). LongRoPE (``rope_scaling`` type ``longrope``: the 128k
Phi-3 and Phi-3.5/Phi-4-mini checkpoints) takes its short or long factors by the engine's context (long_rope.py).
"""

from __future__ import annotations

from engine.models.llama import LlamaForCausalLM


class Phi3ForCausalLM(LlamaForCausalLM):
    stacked_params: dict[str, tuple[str, str]] = {}  # nothing to fuse: the checkpoint's tensors are ours

    def expected_weight_keys(self) -> set[str]:
        return {name for name, _ in self.named_parameters()}
