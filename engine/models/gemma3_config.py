"""What a Gemma 3 ``config.json`` says in its own words, read as transformers' ``Gemma3TextConfig`` reads it.

Gemma 3 alternates local and global attention: a layer slides (``sliding_window``, 512 for the 1B model, 1024
for the larger ones) unless it is every ``sliding_window_pattern``-th one (6: five local layers, then one
global), or as ``layer_types`` lists them. Each kind has its own RoPE: global layers the config's
``rope_theta`` (1e6) with its ``rope_scaling`` (linear 8 on the 4B-27B models), local layers
``rope_local_base_freq`` (1e4) unscaled. transformers 5 writes both into ``rope_parameters``, keyed by the
layer kind. Pure Python: the simulator may read a config without torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

GLOBAL_ROPE_THETA = 1_000_000.0
LOCAL_ROPE_THETA = 10_000.0
SLIDING_WINDOW_PATTERN = 6


def gemma3_layer_windows(raw: dict[str, Any], sliding_window: int | None, num_layers: int) -> tuple[int | None, ...]:
    """Each layer's window: ``sliding_window`` for local layers, None for global ones."""
    layer_types = raw.get("layer_types")
    if not layer_types:
        pattern = raw.get("sliding_window_pattern") or SLIDING_WINDOW_PATTERN
        layer_types = ["sliding_attention" if (index + 1) % pattern else "full_attention" for index in range(num_layers)]
    if len(layer_types) != num_layers or not set(layer_types) <= {"full_attention", "sliding_attention"}:
        raise ValueError(f"config.json: layer_types must list 'full_attention' or 'sliding_attention' for each of the "
                         f"{num_layers} layers, got {layer_types!r}")
    if "sliding_attention" in layer_types and sliding_window is None:
        raise ValueError("config.json: Gemma 3 has sliding_attention layers but sliding_window is null")
    return tuple(sliding_window if kind == "sliding_attention" else None for kind in layer_types)


def gemma3_rope(raw: dict[str, Any], parse_rope: Callable[[dict[str, Any], float], tuple[float, dict | None]]
                ) -> tuple[float, dict[str, Any] | None, float]:
    """(global layers' rope_theta, their scaling or None, local layers' rope_theta). ``parse_rope`` is the Llama
    family's reading of one layer kind's settings (engine/models/config.py)."""
    parameters = raw.get("rope_parameters") or {}
    if "full_attention" in parameters or "sliding_attention" in parameters:
        full = dict(parameters.get("full_attention") or {})
        local = dict(parameters.get("sliding_attention") or {})
        theta, scaling = parse_rope({"rope_parameters": full, "max_position_embeddings": raw.get("max_position_embeddings")},
                                    GLOBAL_ROPE_THETA)
        if local.get("rope_type", "default") != "default":
            raise ValueError(f"config.json: Gemma 3's sliding_attention RoPE must be the default type, got "
                             f"{local.get('rope_type')!r}")
        return theta, scaling, float(local.get("rope_theta", LOCAL_ROPE_THETA))
    theta, scaling = parse_rope({key: raw[key] for key in ("rope_theta", "rope_scaling", "max_position_embeddings")
                                 if key in raw}, GLOBAL_ROPE_THETA)
    local_theta = raw.get("rope_local_base_freq")
    return theta, scaling, float(LOCAL_ROPE_THETA if local_theta is None else local_theta)


def check_gemma3(raw: dict[str, Any]) -> None:
    """Refuse what this engine would run as another model."""
    if raw.get("attn_logit_softcapping") is not None:
        raise ValueError(f"config.json: attn_logit_softcapping={raw['attn_logit_softcapping']!r} (tanh capping of "
                         "attention scores, Gemma 2's) is not supported by the attention backends")
    if raw.get("use_bidirectional_attention"):
        raise ValueError("config.json: use_bidirectional_attention=true (an embedding variant of Gemma 3) is not "
                         "supported: the engine attends causally")
    scalar = raw.get("query_pre_attn_scalar", 256)
    if isinstance(scalar, bool) or not isinstance(scalar, (int, float)) or scalar <= 0:
        raise ValueError(f"config.json: query_pre_attn_scalar must be a positive number, got {scalar!r}")
    cap = raw.get("final_logit_softcapping")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or cap <= 0):
        raise ValueError(f"config.json: final_logit_softcapping must be a positive number or null, got {cap!r}")
