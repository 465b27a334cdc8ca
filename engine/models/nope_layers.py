"""Which layers use RoPE and which slide, for the models that leave RoPE out of some layers ("NoPE" layers), as
transformers reads their configs:

* Cohere2 (Command-R7B, Command-A): three sliding-window layers to one full-attention layer
  (``sliding_window_pattern``, default 4, or ``layer_types``); only the windowed layers use RoPE.
* SmolLM3: ``no_rope_layers`` (1: RoPE, 0: none; default every fourth layer without), and with
  ``use_sliding_window`` the NoPE layers slide unless ``layer_types`` says otherwise.
* EXAONE 4.0: Cohere2's pattern (``sliding_window_pattern``, default 4, or ``layer_types``), the full layers
  without RoPE; without a ``sliding_window`` (the 1.2B model) every layer is full and uses RoPE.
"""

from __future__ import annotations

from typing import Any

from engine.models.layer_types import checked_layer_types, windows_of


def cohere2_layers(raw: dict[str, Any], sliding_window: int | None, num_layers: int
                   ) -> tuple[tuple[int | None, ...], tuple[bool, ...]]:
    """(each layer's window, whether it uses RoPE)."""
    pattern = raw.get("sliding_window_pattern") or 4
    layer_types = checked_layer_types(raw, num_layers, ["sliding_attention" if (index + 1) % pattern
                                                        else "full_attention" for index in range(num_layers)])
    return windows_of(layer_types, sliding_window), tuple(kind == "sliding_attention" for kind in layer_types)


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
    layer_types = checked_layer_types(raw, num_layers, ["full_attention" if rope else "sliding_attention"
                                                        for rope in uses_rope])
    return windows_of(layer_types, sliding_window), uses_rope


def exaone4_layers(raw: dict[str, Any], sliding_window: int | None, num_layers: int
                   ) -> tuple[tuple[int | None, ...], tuple[bool, ...]]:
    """(each layer's window, whether it uses RoPE)."""
    if sliding_window is None:
        layer_types = checked_layer_types(raw, num_layers, ["full_attention"] * num_layers)
        return windows_of(layer_types, None, "an EXAONE 4 config with sliding_attention layers needs a "
                                             "sliding_window, got null"), (True,) * num_layers
    pattern = raw.get("sliding_window_pattern", 4)
    if not isinstance(pattern, int) or isinstance(pattern, bool) or pattern < 1:
        if not raw.get("layer_types"):
            raise ValueError(f"config.json: sliding_window_pattern {pattern!r} needs layer_types beside it (transformers "
                             "derives the layers from a positive integer only)")
        default = None
    else:
        default = ["sliding_attention" if (index + 1) % pattern else "full_attention" for index in range(num_layers)]
    layer_types = checked_layer_types(raw, num_layers, default)
    return windows_of(layer_types, sliding_window), tuple(kind == "sliding_attention" for kind in layer_types)
