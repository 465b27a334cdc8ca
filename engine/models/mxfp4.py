"""MXFP4 weights (the OCP microscaling format gpt-oss's experts are published in), dequantized at load.

A row of ``32 * G`` weights is stored as ``G`` blocks: 16 bytes holding 32 FP4 (E2M1) codes, the low nibble first,
and one E8M0 scale byte per block, the power of two ``2 ** (byte - 127)`` that multiplies all 32. E2M1's sixteen
codes are the values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives (code 8 + i is -value(i)). Every code times
a power of two is exact in float32 and bfloat16 (within their exponent range), so the dequantized weights are the
quantized model's exactly.

This engine runs them as 16- or 32-bit weights (vLLM runs MXFP4 matmuls natively on GPUs that have them); the
simulator prices native MXFP4 (sim/weight_quantization.py).
"""

from __future__ import annotations

import torch

# E2M1 code -> value.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
SCALE_BIAS = 127  # E8M0: the byte is the exponent plus 127
CODES_PER_BYTE = 2


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``blocks`` [..., G, 16] uint8 and ``scales`` [..., G] uint8 -> weights [..., 32 * G] in ``dtype``."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"MXFP4 blocks and scales must be uint8, got {blocks.dtype} and {scales.dtype}")
    if blocks.shape[:-1] != scales.shape:
        raise ValueError(f"MXFP4 blocks of shape {tuple(blocks.shape)} need scales of shape "
                         f"{tuple(blocks.shape[:-1])}, got {tuple(scales.shape)}")
    if blocks.dim() > 2 and blocks.shape[0] > 1:
        # One leading slice (an expert) at a time: the codes' indices take 16 bytes per weight while they live.
        return torch.stack([dequantize_mxfp4(block, scale, dtype) for block, scale in zip(blocks, scales)])
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=blocks.device)
    codes = torch.stack((blocks & 0x0F, blocks >> 4), dim=-1).to(torch.long)  # [..., G, 16, 2]: low nibble first
    values = table[codes].flatten(-2)  # [..., G, 32]
    exponents = scales.to(torch.int32) - SCALE_BIAS
    return torch.ldexp(values, exponents[..., None]).flatten(-2).to(dtype)
