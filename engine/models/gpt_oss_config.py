"""What a gpt-oss config.json says beyond the Llama fields (transformers' GptOssConfig defaults for absent keys).

* Layers alternate a 128-token sliding window (even layers) and the full context, unless ``layer_types`` lists them.
* RoPE is YaRN (factor 32 over 4,096 original positions, ``truncate`` false) when the config names none.
* Every layer's MLP is a mixture of ``num_local_experts`` experts, ``intermediate_size`` wide, ``num_experts_per_tok``
  of them per token; their gated activation is clamped at ``swiglu_limit`` with ``swiglu_alpha`` in its sigmoid
  (gpt_oss.py).
"""

from __future__ import annotations

from typing import Any

from engine.models.layer_types import checked_layer_types, windows_of

GPT_OSS_DEFAULT_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                        "original_max_position_embeddings": 4096}


def gpt_oss_layer_windows(raw: dict[str, Any], sliding_window: int | None, num_layers: int) -> tuple[int | None, ...]:
    layer_types = checked_layer_types(raw, num_layers, ["sliding_attention" if index % 2 == 0 else "full_attention"
                                                        for index in range(num_layers)])
    return windows_of(layer_types, sliding_window)


def gpt_oss_moe(raw: dict[str, Any], num_experts: int, top_k: int) -> dict[str, Any]:
    """The keyword arguments of a ``MoEConfig``: a softmax over the top-k router logits (so the weights sum to 1),
    in the model's dtype."""
    for key, default in (("swiglu_limit", 7.0), ("swiglu_alpha", 1.702)):
        value = raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"config.json: {key} must be a positive number, got {value!r}")
    return dict(num_experts=num_experts, num_experts_per_token=top_k,
                expert_intermediate_size=int(raw["intermediate_size"]), normalize_top_k=True,
                routing_weights_in_float32=False)
