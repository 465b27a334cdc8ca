"""LongRoPE (``rope_scaling`` type ``longrope``, older configs ``su``): the 128k Phi-3 models, Phi-3.5-mini and
Phi-4-mini.

The checkpoint gives two lists of per-frequency divisors: ``short_factor`` for sequences within the pretraining
context (``original_max_position_embeddings``, 4,096 for all of them) and ``long_factor`` beyond it, plus one
factor that scales cos and sin alike (``attention_factor``; when absent, transformers' and vLLM's
``sqrt(1 + ln(s) / ln(original))`` with ``s = max_position_embeddings / original``, or the config's ``factor``).

Which list applies is chosen once per engine, not per sequence: the long one when ``max_model_len`` exceeds the
original context, as vLLM does. Keys cached under one set of angles stay valid for the whole request (switching
when a sequence crossed 4,096 tokens would leave its earlier keys turned by the other set), and the result does
not depend on what else is batched. transformers picks per forward call by the longest position in it, which is
the same choice whenever a call's sequences lie all within, or reach beyond, the original context under the
engine's ``max_model_len``.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

LONGROPE_TYPES = ("longrope", "su")  # "su": the name the first Phi-3-128k configs used


def parse_longrope(scaling: dict[str, Any], raw: dict[str, Any]) -> dict[str, Any]:
    """The normalized scaling dict: both factor lists checked to be numbers, ``original_max_position_embeddings``
    taken as transformers takes it (Phi-3 keeps it at the top level of config.json, which wins; else the scaling's
    own; else ``max_position_embeddings``) and ``attention_factor`` resolved."""
    for key in ("short_factor", "long_factor"):
        factors = scaling.get(key)
        if not isinstance(factors, list) or not factors or not all(
                isinstance(value, Real) and not isinstance(value, bool) and value > 0 for value in factors):
            raise ValueError(f"config.json: rope scaling of type 'longrope' needs {key} as a list of positive "
                             f"numbers, got {factors!r}")
    max_positions = raw.get("max_position_embeddings")
    original = raw.get("original_max_position_embeddings") or scaling.get("original_max_position_embeddings") \
        or max_positions
    if not isinstance(original, int) or isinstance(original, bool) or original < 1:
        raise ValueError("config.json: rope scaling of type 'longrope' needs original_max_position_embeddings (the "
                         f"pretraining context) as a positive integer, got {original!r}")
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        factor = scaling.get("factor")
        if factor is None:
            factor = (max_positions or original) / original
        attention_factor = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
    if not isinstance(attention_factor, Real) or attention_factor <= 0:
        raise ValueError(f"config.json: rope scaling's attention_factor must be a positive number, "
                         f"got {attention_factor!r}")
    return {**scaling, "rope_type": "longrope", "original_max_position_embeddings": original,
            "attention_factor": float(attention_factor)}


def check_longrope_factors(scaling: dict[str, Any], rotary_dim: int) -> None:
    """Each list holds one divisor per rotated pair of features (``rotary_dim / 2``, after partial rotary)."""
    for key in ("short_factor", "long_factor"):
        if len(scaling[key]) != rotary_dim // 2:
            raise ValueError(f"config.json: rope scaling's {key} has {len(scaling[key])} values; the model turns "
                             f"{rotary_dim} features of each head, so it needs {rotary_dim // 2}")


def longrope_inv_freq(rotary_dim: int, rope_theta: float, scaling: dict[str, Any], long_context: bool) -> torch.Tensor:
    """[rotary_dim / 2] float32 inverse frequencies: each pair's wavelength stretched by its short or long factor
    (the product taken before the reciprocal, in transformers' order, so that the two agree to the bit)."""
    import torch  # here, so that reading a config (parse_longrope) needs no torch: the simulator reads them
    factors = torch.tensor(scaling["long_factor" if long_context else "short_factor"], dtype=torch.float32)
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).to(torch.float32) / rotary_dim
    return 1.0 / (factors * rope_theta ** exponents)


def uses_long_factors(scaling: dict[str, Any], max_model_len: int) -> bool:
    """vLLM's rule: the long factors whenever the engine admits sequences beyond the pretraining context."""
    return max_model_len > scaling["original_max_position_embeddings"]
