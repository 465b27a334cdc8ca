"""Llama 4's config.json (Scout, Maverick): what differs from Llama's, read as transformers' Llama4TextConfig reads it.

- ``Llama4ForConditionalGeneration`` checkpoints (the published ones) nest the language model's keys in
  ``text_config``; the engine serves the language model, text in, text out (multimodal_text.py).
- Every ``no_rope_layer_interval``-th layer (4) has no RoPE (``no_rope_layers``: 1 = RoPE), attends the whole
  context and scales its queries by ``log1p(floor((position + 1) / floor_scale)) * attn_scale + 1``
  (``attn_temperature_tuning``); the other layers attend within chunks of ``attention_chunk_size`` (8192) tokens
  and L2-normalize q and k after RoPE (``use_qk_norm``). RoPE turns interleaved pairs.
- ``moe_layers`` (default every ``interleave_moe_layer_step``-th layer: all of Scout's, every other of Maverick's)
  hold ``num_local_experts`` experts of width ``intermediate_size``, top-``num_experts_per_tok`` with sigmoid
  scores applied to the expert's input, and an ungated shared expert of the same width; the rest a dense MLP of
  width ``intermediate_size_mlp``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LLAMA4_MODEL_TYPES = ("llama4", "llama4_text")


@dataclass(frozen=True)
class Llama4Layers:
    attention_chunk_size: int | None
    dense_mlp_size: int  # intermediate_size_mlp, the dense layers' width
    temperature_tuning: bool
    floor_scale: float
    attn_scale: float
    qk_norm: bool


def llama4_uses_rope(raw: dict[str, Any], num_layers: int) -> tuple[bool, ...]:
    interval = raw.get("no_rope_layer_interval") or 4
    uses = raw.get("no_rope_layers") or [int((index + 1) % interval != 0) for index in range(num_layers)]
    if len(uses) != num_layers or any(value not in (0, 1) for value in uses):
        raise ValueError(f"config.json: no_rope_layers must hold a 0 or 1 for each of {num_layers} layers, got {uses!r}")
    return tuple(bool(value) for value in uses)


def llama4_moe(raw: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """MoEConfig's fields (the router's own rule is llama4.py's)."""
    experts, top_k = int(raw.get("num_local_experts") or 16), int(raw.get("num_experts_per_tok") or 1)
    if not 1 <= top_k <= experts:
        raise ValueError(f"config.json: num_experts_per_tok must be in [1, num_local_experts={experts}], got {top_k}")
    step = int(raw.get("interleave_moe_layer_step") or 1)
    moe_layers = raw.get("moe_layers")
    moe_layers = list(range(step - 1, num_layers, step)) if moe_layers is None else moe_layers
    width = int(raw.get("intermediate_size") or 8192)
    return dict(num_experts=experts, num_experts_per_token=top_k, expert_intermediate_size=width,
                normalize_top_k=False, routing_weights_in_float32=False, shared_expert_intermediate_size=width,
                dense_layers=tuple(index for index in range(num_layers) if index not in moe_layers))


def llama4_layers(raw: dict[str, Any]) -> Llama4Layers:
    chunk = raw.get("attention_chunk_size", 8192)
    if chunk is not None and (not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1):
        raise ValueError(f"config.json: attention_chunk_size must be a positive integer or null, got {chunk!r}")
    return Llama4Layers(attention_chunk_size=chunk, dense_mlp_size=int(raw.get("intermediate_size_mlp") or 16384),
                        temperature_tuning=bool(raw.get("attn_temperature_tuning", True)),
                        floor_scale=float(raw.get("floor_scale") or 8192), attn_scale=float(raw.get("attn_scale", 0.1)),
                        qk_norm=bool(raw.get("use_qk_norm", True)))
