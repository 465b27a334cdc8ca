"""FP8 KV cache: the storage format and its per-tensor scales (torch reference, the source of truth).

A cache of dtype ``torch.float8_e4m3fn`` stores ``value / scale``, rounded to nearest (ties to even),
saturated to the format's finite range; reading multiplies by the same scale. One scale per tensor
(``k_scale`` for keys, ``v_scale`` for values), as vLLM's ``kv_cache_dtype="fp8"`` does.

Saturation (rather than torch's plain cast, which turns anything past 464 into NaN) is deliberate: a
single NaN in the cache would poison every attention row that reads its block, while a clipped outlier
only costs accuracy. It is also what the hardware conversion the kernels use does (``satfinite``).
"""

from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448.0

Scale = float | torch.Tensor


def is_fp8(dtype: torch.dtype) -> bool:
    """True for the fp8 cache format the kernels support; other 1-byte float formats are refused."""
    if dtype == FP8_DTYPE:
        return True
    if dtype.is_floating_point and dtype.itemsize == 1:
        raise ValueError(f"KV cache dtype {dtype} is not supported; the fp8 cache format is {FP8_DTYPE}")
    return False


def check_scale(name: str, scale: Scale) -> None:
    # A zero or negative scale would turn every stored value into inf/NaN or flip its sign.
    value = float(scale) if not isinstance(scale, torch.Tensor) or scale.device.type == "cpu" else None
    if value is not None and not value > 0:
        raise ValueError(f"{name} must be a positive number, got {value}")


def quantize_fp8(values: torch.Tensor, scale: Scale) -> torch.Tensor:
    """``values / scale`` in float32, saturated to +-448 and rounded to nearest even: what the cache stores."""
    # The divisor is made a float32 tensor on the values' device because torch's CUDA division by a
    # host scalar multiplies by its reciprocal, which rounds differently from the IEEE division the
    # kernels (and torch on CPU) perform, and the kernels must match this reference byte for byte.
    divisor = torch.as_tensor(scale, dtype=torch.float32, device=values.device)
    return (values.float() / divisor).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def dequantize_fp8(stored: torch.Tensor, scale: Scale, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """What a reader of the cache sees: the stored value times its scale."""
    return (stored.float() * scale).to(dtype)
