"""reshape_and_cache as a Triton kernel: same contract and same bytes as ``kernels/reshape_and_cache.py``.

One program copies one token's keys and values (``num_kv_heads * head_size`` elements each, in chunks of
at most ``MAX_ELEMENTS_PER_PROGRAM``) to its slot. The work is a pure gather-scatter, so the figure of
merit is bandwidth (``benchmarks/kernels.py`` compares it with a plain device copy).

Padding tokens (slot -1) are masked rather than branched around: a masked load or store moves no bytes,
and a mask is the one form of "skip" every Triton backend, the CPU interpreter included, supports.

Importing this module imports triton; import it lazily (see ``kernels/triton_support.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.fp8 import FP8_MAX, Scale, check_scale, is_fp8
from kernels.reshape_and_cache import check_reshape_and_cache_args
from kernels.triton_support import check_launchable, interpreter_enabled, next_power_of_2

INTERPRETED = interpreter_enabled()  # fixed when the kernels below are decorated, i.e. now
MAX_ELEMENTS_PER_PROGRAM = 2048


@triton.jit
def round_to_fp8_e4m3(x, scale, FP8_MAX_VALUE: tl.constexpr):
    """``x / scale`` (float32) saturated and rounded to nearest-even on the float8_e4m3fn grid.

    The rounding is done here, explicitly, so the final cast only ever sees exactly representable
    values and the stored byte is torch's on every target: native ``cvt`` on Hopper/Ada, Triton's
    emulated conversion on older GPUs, and the CPU interpreter, whose fp8 cast drops the carry when a
    mantissa rounds up (1.96 becomes 1.0, not 2.0).
    """
    x = tl.math.div_rn(x, scale)  # IEEE division, as torch's; plain `/` may be approximate on GPU
    x = tl.minimum(tl.maximum(x, -FP8_MAX_VALUE), FP8_MAX_VALUE)
    bits = x.to(tl.uint32, bitcast=True)
    # e4m3 keeps 3 mantissa bits; below 2**-6 it is subnormal with a fixed spacing of 2**-9.
    exponent = tl.maximum(((bits >> 23) & 0xFF).to(tl.int32) - 127, -6)
    to_grid = ((130 - exponent) << 23).to(tl.float32, bitcast=True)  # 2**(3 - exponent): exact scaling
    from_grid = ((124 + exponent) << 23).to(tl.float32, bitcast=True)  # 2**(exponent - 3)
    scaled = tl.abs(x) * to_grid  # in [0, 16): an integer number of grid steps plus a fraction
    steps = scaled.to(tl.int32)  # truncation toward zero
    fraction = scaled - steps.to(tl.float32)
    round_up = (fraction > 0.5) | ((fraction == 0.5) & ((steps & 1) == 1))
    magnitude = (steps + round_up.to(tl.int32)).to(tl.float32) * from_grid
    # Copy the sign bit back so that -0.0 and tiny negatives store 0x80, as torch does.
    return (magnitude.to(tl.uint32, bitcast=True) | (bits & 0x80000000)).to(tl.float32, bitcast=True)


@triton.jit(do_not_specialize=["num_elements"])  # varies every step: see triton_paged_attention.py
def _reshape_and_cache_kernel(
    key_ptr, value_ptr, key_cache_ptr, value_cache_ptr, slot_mapping_ptr,
    key_stride_token, key_stride_head, key_stride_dim,
    value_stride_token, value_stride_head, value_stride_dim,
    cache_stride_block, cache_stride_offset, cache_stride_head, cache_stride_dim,
    k_scale, v_scale, head_size, num_elements,
    BLOCK_SIZE: tl.constexpr,
    ELEMENTS: tl.constexpr,
    FP8: tl.constexpr,
    FP8_MAX_VALUE: tl.constexpr,
    CONTIGUOUS_ROWS: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)  # int64: token * stride overflows int32 on large batches
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    elements = tl.program_id(1) * ELEMENTS + tl.arange(0, ELEMENTS)
    # Broadcast the padding test to the element block: the interpreter rejects a scalar-and-block mask.
    mask = (elements < num_elements) & (tl.zeros([ELEMENTS], tl.int64) + slot >= 0)

    safe_slot = tl.maximum(slot, 0)  # keep the (masked) addresses of padding tokens inside the cache
    slot_base = (safe_slot // BLOCK_SIZE) * cache_stride_block + (safe_slot % BLOCK_SIZE) * cache_stride_offset
    if CONTIGUOUS_ROWS:
        # A token's [num_kv_heads, head_size] row is contiguous on both sides: plain offsets let Triton
        # prove contiguity and issue 16-byte vector accesses, which is what reaches copy bandwidth.
        key_offsets = token * key_stride_token + elements
        value_offsets = token * value_stride_token + elements
        cache_offsets = slot_base + elements
    else:
        head = elements // head_size
        dim = elements % head_size
        key_offsets = token * key_stride_token + head * key_stride_head + dim * key_stride_dim
        value_offsets = token * value_stride_token + head * value_stride_head + dim * value_stride_dim
        cache_offsets = slot_base + head * cache_stride_head + dim * cache_stride_dim
    key = tl.load(key_ptr + key_offsets, mask=mask)
    value = tl.load(value_ptr + value_offsets, mask=mask)
    if FP8:
        key = round_to_fp8_e4m3(key.to(tl.float32), k_scale, FP8_MAX_VALUE)
        value = round_to_fp8_e4m3(value.to(tl.float32), v_scale, FP8_MAX_VALUE)
    tl.store(key_cache_ptr + cache_offsets, key.to(key_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(value_cache_ptr + cache_offsets, value.to(value_cache_ptr.dtype.element_ty), mask=mask)


def triton_reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: Scale = 1.0,
    v_scale: Scale = 1.0,
) -> None:
    """Same arguments and effect as ``kernels.reshape_and_cache.reshape_and_cache``.

    ``key``/``value`` may be strided views (e.g. slices of a fused QKV projection); the caches may be any
    strided view whose per-block layout is ``[block_size, num_kv_heads, head_size]``. Scales given as
    tensors are read once on the host (a device sync: pass floats inside a CUDA graph).
    """
    check_reshape_and_cache_args(key, value, key_cache, value_cache, slot_mapping)
    check_launchable("triton_reshape_and_cache", INTERPRETED, key, value, key_cache, value_cache, slot_mapping)
    if key_cache.stride() != value_cache.stride():
        raise ValueError(f"key_cache strides {key_cache.stride()} differ from value_cache's {value_cache.stride()}")
    fp8 = is_fp8(key_cache.dtype)
    if fp8:
        check_scale("k_scale", k_scale)
        check_scale("v_scale", v_scale)
    num_tokens = slot_mapping.shape[0]
    if num_tokens == 0:
        return
    slot_mapping = slot_mapping.contiguous()  # read with a unit stride; a no-op for the usual tensor
    block_size, num_kv_heads, head_size = key_cache.shape[1:]
    num_elements = num_kv_heads * head_size
    elements = min(next_power_of_2(num_elements), MAX_ELEMENTS_PER_PROGRAM)
    grid = (num_tokens, triton.cdiv(num_elements, elements))
    contiguous_rows = all(t.stride(-1) == 1 and t.stride(-2) == head_size for t in (key, value, key_cache))
    _reshape_and_cache_kernel[grid](
        key, value, key_cache, value_cache, slot_mapping,
        *key.stride(), *value.stride(), *key_cache.stride(),
        float(k_scale), float(v_scale), head_size, num_elements,
        BLOCK_SIZE=block_size, ELEMENTS=elements, FP8=fp8, FP8_MAX_VALUE=FP8_MAX, CONTIGUOUS_ROWS=contiguous_rows,
        num_warps=4 if elements >= 512 else 1,
    )
