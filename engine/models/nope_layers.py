"""Which layers use RoPE and which slide, for the models that leave RoPE out of some layers ("NoPE" layers), as
transformers reads their configs:

* Cohere2 (Command-R7B, Command-A): three sliding-window layers to one full-attention layer
  (``sliding_window_pattern``, default 4, or ``layer_types``); only the windowed layers use RoPE.
* SmolLM3: ``no_rope_layers`` (1: RoPE, 0: none; default every fourth layer without), and with
  ``use_sliding_window`` the NoPE layers slide unless ``layer_types`` says otherwise.
"""

from __future__ import annotations

from typing import Any

_KINDS = {"full_attention", "sliding_attention"}


def _layer_types(raw: dict[str, Any], num_layers: int, default: list[str]) -> list[str]:
    layer_types = raw.get("layer_types") or default
    if len(layer_types) != num_layers or not set(layer_types) <= _KINDS:
        raise ValueError(f"config.json: layer_types must list 'full_attention' or 'sliding_attention' for each of the "
                         f"{num_layers} layers, got {layer_types!r}")
    return layer_types


def cohere2_layers(raw: dict[str, Any], sliding_window: int | None, num_layers: int
                   ) -> tuple[tuple[int | None, ...], tuple[bool, ...]]:
    """(each layer's window, whether it uses RoPE)."""
    pattern = raw.get("sliding_window_pattern") or 4
    layer_types = _layer_types(raw, num_layers, ["sliding_attention" if (index + 1) % pattern else "full_attention"
                                                 for index in range(num_layers)])
    if "sliding_attention" in layer_types and sliding_window is None:
        raise ValueError("config.json: layer_types has sliding_attention layers but sliding_window is null")
    sliding = [kind == "sliding_attention" for kind in layer_types]
    return tuple(sliding_window if slides else None for slides in sliding), tuple(sliding)


def smollm3_layers(raw: dict[str, Any], sliding_window: int | None, num_layers: int
                   ) -> tuple[tuple[int | None, ...], tuple[bool, ...]]:
    interval = raw.get("no_rope_layer_interval") or 4
    uses_rope = raw.get("no_rope_layers") or [int((index + 1) % interval != 0) for index in range(num_layers)]
    if len(uses_rope) != num_layers or not set(uses_rope) <= {0, 1}:
        raise ValueError(f"config.json: no_rope_layers must hold 1 (RoPE) or 0 (none) for each of the {num_layers} "
                         f"layers, got {uses_rope!r}")
    uses_rope = tuple(bool(flag) for flag in uses_rope)
    if not raw.get("use_sliding_window") or sliding_window is None:
        return (None,) * num_layers, uses_rope
    layer_types = _layer_types(raw, num_layers, ["full_attention" if rope else "sliding_attention"
                                                 for rope in uses_rope])
    return tuple(sliding_window if kind == "sliding_attention" else None for kind in layer_types), uses_rope
