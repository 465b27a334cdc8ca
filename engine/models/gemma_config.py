"""What a Gemma 2 or Gemma 3 ``config.json`` says in its own words, read as transformers' ``Gemma2Config`` and
``Gemma3TextConfig`` read it.

Gemma 2 alternates a local layer (``sliding_window``, 4096) with a global one, caps attention scores
(``attn_logit_softcapping``, 50) and final logits (``final_logit_softcapping``, 30), one RoPE for all layers.
Gemma 3 alternates local and global attention: a layer slides (``sliding_window``, 512 for the 1B model, 1024
for the larger ones) unless it is every ``sliding_window_pattern``-th one (6: five local layers, then one
global), or as ``layer_types`` lists them. Each kind has its own RoPE: global layers the config's
``rope_theta`` (1e6) with its ``rope_scaling`` (linear 8 on the 4B-27B models), local layers
``rope_local_base_freq`` (1e4) unscaled. transformers 5 writes both into ``rope_parameters``, keyed by the
layer kind. Pure Python: the simulator may read a config without torch.
"""

from __future__ import annotations

from typing import Any

from engine.models.layer_types import checked_layer_types, windows_of
from engine.models.rope_config import layer_kind_rope

GLOBAL_ROPE_THETA = 1_000_000.0
LOCAL_ROPE_THETA = 10_000.0
# Every pattern-th layer is global: Gemma 2 alternates, Gemma 3 has five local layers to one global.
SLIDING_WINDOW_PATTERN = {"gemma2": 2, "gemma3_text": 6}


def gemma_layer_windows(raw: dict[str, Any], model_type: str, sliding_window: int | None,
                        num_layers: int) -> tuple[int | None, ...]:
    """Each layer's window: ``sliding_window`` for local layers, None for global ones."""
    pattern = (raw.get("sliding_window_pattern") if model_type == "gemma3_text" else None) \
        or SLIDING_WINDOW_PATTERN[model_type]
    layer_types = checked_layer_types(raw, num_layers, ["sliding_attention" if (index + 1) % pattern
                                                        else "full_attention" for index in range(num_layers)])
    return windows_of(layer_types, sliding_window,
                      "a Gemma config with sliding_attention layers needs a sliding_window, got null")


def gemma3_rope(raw: dict[str, Any]) -> tuple[float, dict[str, Any] | None, float]:
    """(global layers' rope_theta, their scaling or None, local layers' rope_theta): in the Hub's spelling the local
    base is ``rope_local_base_freq``."""
    theta, scaling, local_theta = layer_kind_rope(raw, GLOBAL_ROPE_THETA, "Gemma 3")
    if local_theta is None:
        local_theta = raw.get("rope_local_base_freq")
    return theta, scaling, float(LOCAL_ROPE_THETA if local_theta is None else local_theta)


def check_gemma(raw: dict[str, Any]) -> None:
    """Refuse what this engine would run as another model, and caps that are not positive numbers."""
    if raw.get("use_bidirectional_attention"):
        raise ValueError("config.json: use_bidirectional_attention=true (an embedding variant of Gemma 3) is not "
                         "supported: the engine attends causally")
    scalar = raw.get("query_pre_attn_scalar", 256)
    if isinstance(scalar, bool) or not isinstance(scalar, (int, float)) or scalar <= 0:
        raise ValueError(f"config.json: query_pre_attn_scalar must be a positive number, got {scalar!r}")
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        cap = raw.get(key)
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or cap <= 0):
            raise ValueError(f"config.json: {key} must be a positive number or null, got {cap!r}")


def gemma_soft_caps(raw: dict[str, Any], model_type: str) -> tuple[float | None, float | None]:
    """(attention-score cap, final-logit cap) with transformers' defaults for keys left out: Gemma 2 caps both
    (50 and 30), Gemma 3 neither."""
    defaults = (50.0, 30.0) if model_type == "gemma2" else (None, None)
    return tuple(raw[key] if key in raw else default
                 for key, default in zip(("attn_logit_softcapping", "final_logit_softcapping"), defaults))
