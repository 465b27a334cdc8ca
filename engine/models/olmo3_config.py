"""What an OLMo 3 ``config.json`` (``Olmo3ForCausalLM``) says, read as transformers' ``Olmo3Config`` reads it.

OLMo 3 is OLMo 2 (olmo2.py) with sliding-window attention on three layers of four (``sliding_window`` 4096, every
fourth layer full, or as ``layer_types`` lists them). Its long-context scaling (YaRN on the 7B and 32B models) is
the full layers' only: transformers puts a checkpoint's ``rope_scaling`` on ``full_attention`` and gives the sliding
layers plain RoPE at the same ``rope_theta`` (transformers 5 writes both into ``rope_parameters``, keyed by the
layer kind). Pure Python: the simulator may read a config without torch.
"""

from __future__ import annotations

from typing import Any

from engine.models.layer_types import checked_layer_types, windows_of
from engine.models.rope_config import layer_kind_rope

ROPE_THETA = 500_000.0  # transformers' Olmo3Config default
SLIDING_WINDOW = 4096
FULL_LAYER_EVERY = 4


def olmo3_layer_windows(raw: dict[str, Any], num_layers: int) -> tuple[int | None, ...]:
    """Each layer's window: ``sliding_window`` for the sliding layers, None for every fourth (full) one."""
    layer_types = checked_layer_types(raw, num_layers, ["sliding_attention" if (index + 1) % FULL_LAYER_EVERY
                                                        else "full_attention" for index in range(num_layers)])
    window = raw["sliding_window"] if "sliding_window" in raw else SLIDING_WINDOW
    return windows_of(layer_types, window, "an OLMo 3 config with sliding_attention layers needs a sliding_window, "
                                           "got null")


def olmo3_rope(raw: dict[str, Any]) -> tuple[float, dict[str, Any] | None, float]:
    """(full layers' rope_theta, their scaling or None, sliding layers' rope_theta): module docstring."""
    theta, scaling, local_theta = layer_kind_rope(raw, ROPE_THETA, "OLMo 3")
    return theta, scaling, theta if local_theta is None else local_theta
