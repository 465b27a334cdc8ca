"""A config's ``layer_types`` (each layer "full_attention" or "sliding_attention", as transformers 5 writes them),
checked once for every model that reads them (Qwen2/Qwen3, Gemma, gpt-oss, Cohere2, SmolLM3)."""

from __future__ import annotations

from typing import Any

LAYER_KINDS = ("full_attention", "sliding_attention")


def checked_layer_types(raw: dict[str, Any], num_layers: int, default: list[str] | None = None) -> list[str]:
    """The config's ``layer_types``, else ``default``; a list of the wrong length or kinds is refused by key."""
    layer_types = raw.get("layer_types") or default
    if layer_types is None or len(layer_types) != num_layers or not set(layer_types) <= set(LAYER_KINDS):
        raise ValueError(f"config.json: layer_types must list 'full_attention' or 'sliding_attention' for each of the "
                         f"{num_layers} layers, got {layer_types!r}")
    return list(layer_types)


def windows_of(layer_types: list[str], sliding_window: int | None,
               null_window_error: str = "layer_types has sliding_attention layers but sliding_window is null"
               ) -> tuple[int | None, ...]:
    """Each layer's window: ``sliding_window`` for the sliding layers, None for the others; sliding layers with no
    window are refused (``null_window_error`` says why, in the model's words)."""
    if "sliding_attention" in layer_types and sliding_window is None:
        raise ValueError(f"config.json: {null_window_error}")
    return tuple(sliding_window if kind == "sliding_attention" else None for kind in layer_types)
