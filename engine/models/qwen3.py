"""Qwen3: the Llama architecture with an RMSNorm on each head of q and k before RoPE (``q_norm``, ``k_norm``).

Unlike Qwen2 it has no q/k/v bias unless ``attention_bias`` asks for one (which then, as in Llama, also puts
one on o_proj), and its ``head_dim`` is a key of its own (128 by default), not hidden_size divided by the
heads. Sliding-window layers (``use_sliding_window`` from ``max_window_layers`` on, or ``layer_types``, the
rule of Qwen2) attend their window.
"""

from __future__ import annotations

from engine.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    qk_norm = True
