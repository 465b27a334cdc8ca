"""Allocation of the per-layer paged KV caches in the layout every backend reads."""

from __future__ import annotations

import torch

from engine.core.kv_cache_grouping import KVCacheGrouping
from engine.runner.attention.backend import GroupKVCache, KVCache


def allocate_kv_caches(num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
                       dtype: torch.dtype, device: torch.device | str, zero: bool = True) -> list[KVCache]:
    """One (key_cache, value_cache) pair per layer, each [num_blocks, block_size, num_kv_heads, head_size].

    Zeroed by default: backends never let unwritten slots influence results, but zeros keep a freshly
    allocated cache free of NaN bit patterns, which makes debugging dumps readable.
    """
    make = torch.zeros if zero else torch.empty
    shape = (num_blocks, block_size, num_kv_heads, head_size)
    return [(make(shape, dtype=dtype, device=device), make(shape, dtype=dtype, device=device))
            for _ in range(num_layers)]


def allocate_grouped_kv_caches(grouping: KVCacheGrouping, num_layers: int, num_blocks: int, block_size: int,
                               num_kv_heads: int, head_size: int, dtype: torch.dtype,
                               device: torch.device | str) -> list[GroupKVCache]:
    """A hybrid KV cache's per-layer caches: ``layers_per_block`` (key, value) slots of ``num_blocks`` blocks; a
    layer at place ``i`` of its group reads and writes slot ``i`` through its group's block table, so the slot's
    tensors hold every group's ``i``-th layer, each in its own group's blocks."""
    slots = allocate_kv_caches(grouping.layers_per_block, num_blocks, block_size, num_kv_heads, head_size, dtype,
                               device)
    caches = []
    for layer in range(num_layers):
        group, slot = grouping.group_and_slot(layer)
        caches.append(GroupKVCache(*slots[slot], group))
    return caches


def kv_cache_bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_size: int,
                             dtype: torch.dtype) -> int:
    """Bytes one block costs across all layers, keys and values: what a memory budget divides by."""
    element_size = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * block_size * num_kv_heads * head_size * element_size
