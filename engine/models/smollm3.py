"""SmolLM3 (``SmolLM3ForCausalLM``): the Llama architecture with RoPE left out of every fourth layer
(``no_rope_layers``; ModelConfig.layer_uses_rope, read by nope_layers.py), and windows on the NoPE layers when
``use_sliding_window`` is set."""

from __future__ import annotations

from engine.models.llama import LlamaForCausalLM


class SmolLM3ForCausalLM(LlamaForCausalLM):
    pass
