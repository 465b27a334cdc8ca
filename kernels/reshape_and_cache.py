"""Write a step's keys and values into the paged KV cache (torch reference, the source of truth).

Layout, shared by every attention backend and kernel in the project:

    key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_size]

A token's *slot* is ``block_id * block_size + offset_in_block``, so the cache viewed as
``[num_blocks * block_size, num_kv_heads, head_size]`` is indexed by slot directly. This is the layout
FlashAttention's paged path reads (one page = one block, tokens outermost), which is why it was chosen.

``slot_mapping[i] == -1`` marks a padding token (e.g. a batch padded to a captured size): it owns no
slot and must not be written anywhere.

An fp8 cache (``torch.float8_e4m3fn``, see ``kernels/fp8.py``) stores ``key / k_scale`` and
``value / v_scale``; for any other cache dtype the scales are ignored and values are cast as they are.
The Triton and CUDA kernels (``kernels/triton_reshape_and_cache.py``, ``kernels/cuda_reshape_and_cache.py``)
must write exactly the bytes this function writes.
"""

from __future__ import annotations

import torch

from kernels.fp8 import Scale, check_scale, is_fp8, quantize_fp8

PADDING_SLOT_ID = -1


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: Scale = 1.0,
    v_scale: Scale = 1.0,
) -> None:
    """Scatter ``key``/``value`` ``[num_tokens, num_kv_heads, head_size]`` into the caches in place.

    Tokens beyond ``slot_mapping.numel()`` are ignored, so callers may pass padded key/value tensors
    with an unpadded (or -1 padded) slot_mapping.
    """
    check_reshape_and_cache_args(key, value, key_cache, value_cache, slot_mapping)
    num_tokens = slot_mapping.shape[0]
    num_blocks, block_size, num_kv_heads, head_size = key_cache.shape

    # view() (not reshape) so that the write lands in the cache itself; a non-contiguous cache would
    # silently get a copy, so let view() raise instead.
    flat_key_cache = key_cache.view(num_blocks * block_size, num_kv_heads, head_size)
    flat_value_cache = value_cache.view(num_blocks * block_size, num_kv_heads, head_size)

    slots = slot_mapping.to(torch.long)
    valid = slots >= 0
    # One boolean compaction instead of a Python loop over tokens: the padding rows are dropped and
    # every real token is written with a single index_put_ per cache.
    valid_slots = slots[valid]
    new_keys, new_values = key[:num_tokens][valid], value[:num_tokens][valid]
    if is_fp8(key_cache.dtype):
        check_scale("k_scale", k_scale)
        check_scale("v_scale", v_scale)
        new_keys, new_values = quantize_fp8(new_keys, k_scale), quantize_fp8(new_values, v_scale)
    flat_key_cache.index_put_((valid_slots,), new_keys.to(key_cache.dtype))
    flat_value_cache.index_put_((valid_slots,), new_values.to(value_cache.dtype))


def check_reshape_and_cache_args(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                                 value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """The shape rules every implementation enforces, with the same messages."""
    if slot_mapping.dim() != 1 or slot_mapping.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"slot_mapping must be a 1-d int32/int64 tensor, got {slot_mapping.dtype} "
                         f"of shape {tuple(slot_mapping.shape)}")
    num_tokens = slot_mapping.shape[0]
    if key.shape[0] < num_tokens or value.shape[0] < num_tokens:
        raise ValueError(
            f"reshape_and_cache: slot_mapping has {num_tokens} entries but key/value have "
            f"{key.shape[0]}/{value.shape[0]} tokens")
    if key_cache.shape != value_cache.shape or key_cache.dtype != value_cache.dtype:
        raise ValueError(f"key_cache {tuple(key_cache.shape)} {key_cache.dtype} and value_cache "
                         f"{tuple(value_cache.shape)} {value_cache.dtype} differ")
    if key_cache.dim() != 4:
        raise ValueError(f"caches must be [num_blocks, block_size, num_kv_heads, head_size], "
                         f"got shape {tuple(key_cache.shape)}")
    num_kv_heads, head_size = key_cache.shape[2:]
    if key.shape[1:] != (num_kv_heads, head_size):
        raise ValueError(
            f"key has per-token shape {tuple(key.shape[1:])}, the cache holds {(num_kv_heads, head_size)}")
    if value.shape[1:] != key.shape[1:]:
        raise ValueError(f"value has per-token shape {tuple(value.shape[1:])}, key has {tuple(key.shape[1:])}")
