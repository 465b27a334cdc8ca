"""Write a step's keys and values into the paged KV cache (torch reference, the source of truth).

Layout, shared by every attention backend and kernel in the project:

    key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_size]

A token's *slot* is ``block_id * block_size + offset_in_block``, so the cache viewed as
``[num_blocks * block_size, num_kv_heads, head_size]`` is indexed by slot directly. This is the layout
FlashAttention's paged path reads (one page = one block, tokens outermost), which is why it was chosen.

``slot_mapping[i] == -1`` marks a padding token (e.g. a batch padded to a captured size): it owns no
slot and must not be written anywhere.
"""

from __future__ import annotations

import torch

PADDING_SLOT_ID = -1


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter ``key``/``value`` ``[num_tokens, num_kv_heads, head_size]`` into the caches in place.

    Tokens beyond ``slot_mapping.numel()`` are ignored, so callers may pass padded key/value tensors
    with an unpadded (or -1 padded) slot_mapping.
    """
    num_tokens = slot_mapping.shape[0]
    if key.shape[0] < num_tokens or value.shape[0] < num_tokens:
        raise ValueError(
            f"reshape_and_cache: slot_mapping has {num_tokens} entries but key/value have "
            f"{key.shape[0]}/{value.shape[0]} tokens")
    if key_cache.shape != value_cache.shape:
        raise ValueError(f"key_cache {tuple(key_cache.shape)} and value_cache {tuple(value_cache.shape)} differ")
    num_blocks, block_size, num_kv_heads, head_size = key_cache.shape
    if key.shape[1:] != (num_kv_heads, head_size):
        raise ValueError(
            f"key has per-token shape {tuple(key.shape[1:])}, the cache holds {(num_kv_heads, head_size)}")

    # view() (not reshape) so that the write lands in the cache itself; a non-contiguous cache would
    # silently get a copy, so let view() raise instead.
    flat_key_cache = key_cache.view(num_blocks * block_size, num_kv_heads, head_size)
    flat_value_cache = value_cache.view(num_blocks * block_size, num_kv_heads, head_size)

    slots = slot_mapping.to(torch.long)
    valid = slots >= 0
    # One boolean compaction instead of a Python loop over tokens: the padding rows are dropped and
    # every real token is written with a single index_put_ per cache.
    valid_slots = slots[valid]
    flat_key_cache.index_put_((valid_slots,), key[:num_tokens][valid].to(key_cache.dtype))
    flat_value_cache.index_put_((valid_slots,), value[:num_tokens][valid].to(value_cache.dtype))
