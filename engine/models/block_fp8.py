"""Block-scaled FP8 checkpoints (``quantization_config`` ``quant_method: fp8`` with ``weight_block_size``), as
DeepSeek-V3/R1, Kimi K2 and the Qwen3 ``-FP8`` models are published: dequantized at load.

A quantized linear weight ``X.weight`` [N, K] is stored as float8 (E4M3), with ``X.weight_scale_inv`` [ceil(N / bn),
ceil(K / bk)] float32: the scale of each bn x bk block (the last blocks of a row or column may be partial), so
the weight is ``X.weight * X.weight_scale_inv`` expanded over its blocks. The product is formed in float32 and
rounded once to the model's dtype. Every other tensor (norms, embeddings, routers) is stored as it is.

This engine runs the dequantized weights in 16 or 32 bits (vLLM runs FP8 matmuls on GPUs that have them; the
simulator prices that: sim/weight_quantization.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

SCALE_SUFFIX = "_scale_inv"
_FP8_DTYPES = tuple(getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, name))


def parse_block_fp8(quantization: dict[str, Any]) -> tuple[int, int] | None:
    """(bn, bk) of a block-scaled FP8 ``quantization_config``; None for any other quantization."""
    block = quantization.get("weight_block_size")
    if quantization.get("quant_method") != "fp8" or block is None:
        return None
    if (not isinstance(block, list) or len(block) != 2
            or not all(isinstance(size, int) and not isinstance(size, bool) and size > 0 for size in block)):
        raise ValueError(f"config.json: quantization_config.weight_block_size must be two positive integers, got "
                         f"{block!r}")
    if quantization.get("activation_scheme", "dynamic") != "dynamic":
        raise ValueError(f"config.json: quantization_config.activation_scheme "
                         f"{quantization.get('activation_scheme')!r} is not supported (block FP8 with dynamic "
                         "activation scales is)")
    return block[0], block[1]


def dequantize_block_fp8(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int],
                         dtype: torch.dtype) -> torch.Tensor:
    """``weight`` [..., N, K] float8 times its block scales [..., ceil(N / bn), ceil(K / bk)] -> ``dtype``."""
    rows, columns = weight.shape[-2:]
    expected = (*weight.shape[:-2], -(-rows // block[0]), -(-columns // block[1]))
    if tuple(scale_inv.shape) != expected:
        raise ValueError(f"a weight of shape {tuple(weight.shape)} in blocks of {block[0]}x{block[1]} needs scales of "
                         f"shape {expected}, got {tuple(scale_inv.shape)}")
    scales = scale_inv.float().repeat_interleave(block[0], dim=-2)[..., :rows, :]
    scales = scales.repeat_interleave(block[1], dim=-1)[..., :columns]
    return (weight.float() * scales).to(dtype)


def dequantized_weights(weights: Iterable[tuple[str, torch.Tensor]], block: tuple[int, int],
                        dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors with each FP8 ``X.weight`` and its ``X.weight_scale_inv`` (in either order, in any
    shard) replaced by the dequantized ``X.weight`` once both have been read; a part left without its partner is
    named in an error."""
    pending_weights: dict[str, torch.Tensor] = {}
    pending_scales: dict[str, torch.Tensor] = {}
    for name, tensor in weights:
        if name.endswith(SCALE_SUFFIX):
            weight_name = name[:-len(SCALE_SUFFIX)]
            if weight_name in pending_weights:
                yield weight_name, dequantize_block_fp8(pending_weights.pop(weight_name), tensor, block, dtype)
            else:
                pending_scales[weight_name] = tensor
        elif tensor.dtype in _FP8_DTYPES:
            if name in pending_scales:
                yield name, dequantize_block_fp8(tensor, pending_scales.pop(name), block, dtype)
            else:
                pending_weights[name] = tensor
        else:
            yield name, tensor
    if pending_weights:
        raise ValueError(f"checkpoint tensor {next(iter(pending_weights))!r} is float8 but has no "
                         f"{next(iter(pending_weights))}{SCALE_SUFFIX}")
    if pending_scales:
        name = next(iter(pending_scales))
        raise ValueError(f"checkpoint has {name}{SCALE_SUFFIX} but no float8 {name!r}")
