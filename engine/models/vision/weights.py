"""Loading an image encoder's tensors by name from a vision-language checkpoint, whose other tensors (the language
model's) it skips."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn


def load_encoder_weights(encoder: nn.Module, weights: Iterable[tuple[str, torch.Tensor]],
                         own_name: Callable[[str], str | None], family: str) -> set[str]:
    """Copy each tensor ``own_name`` maps to one of ``encoder``'s parameters (None: not the encoder's); a tensor
    that names no parameter of that shape is a ValueError naming it. Returns the parameters filled."""
    params = dict(encoder.named_parameters())
    loaded = set()
    for checkpoint_name, tensor in weights:
        name = own_name(checkpoint_name)
        if name is None:
            continue
        if name not in params or params[name].shape != tensor.shape:
            expected = tuple(params[name].shape) if name in params else "no such parameter"
            raise ValueError(f"checkpoint tensor {checkpoint_name!r} {tuple(tensor.shape)} has no place in the "
                             f"{family} image encoder ({name}: {expected})")
        params[name].data.copy_(tensor)
        loaded.add(name)
    return loaded
