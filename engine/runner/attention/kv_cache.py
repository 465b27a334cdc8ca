"""Allocation of the per-layer paged KV caches in the layout every backend reads."""

from __future__ import annotations

import torch

from engine.core.kv_cache_grouping import KVCacheGrouping
from engine.runner.attention.backend import GroupKVCache, KVCache


def allocate_kv_caches(num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
                       dtype: torch.dtype, device: torch.device | str, zero: bool = True,
                       value_head_size: int | None = None) -> list[KVCache]:
    """One (key_cache, value_cache) pair per layer, each [num_blocks, block_size, num_kv_heads, head_size].

    ``value_head_size`` 0 (multi-head latent attention, ``ModelConfig.value_head_dim``): the values are read from
    the cached latent, so a layer's pair is its one tensor twice; backends then write the same data into it
    twice and read the values from it. None: values as wide as keys.

    Zeroed by default: backends never let unwritten slots influence results, but zeros keep a freshly
    allocated cache free of NaN bit patterns, which makes debugging dumps readable.
    """
    make = torch.zeros if zero else torch.empty
    shape = (num_blocks, block_size, num_kv_heads, head_size)
    if value_head_size == 0:
        return [(cache, cache) for cache in (make(shape, dtype=dtype, device=device) for _ in range(num_layers))]
    if value_head_size not in (None, head_size):
        raise ValueError(f"value heads of {value_head_size} features beside keys of {head_size}: only equal widths "
                         "or none (0) are supported")
    return [(make(shape, dtype=dtype, device=device), make(shape, dtype=dtype, device=device))
            for _ in range(num_layers)]


def allocate_grouped_kv_caches(grouping: KVCacheGrouping, num_layers: int, num_blocks: int, block_size: int,
                               num_kv_heads: int, head_size: int, dtype: torch.dtype,
                               device: torch.device | str, value_head_size: int | None = None) -> list[GroupKVCache]:
    """A hybrid KV cache's per-layer caches: ``layers_per_block`` (key, value) slots of ``num_blocks`` blocks; a
    layer at place ``i`` of its group reads and writes slot ``i`` through its group's block table, so the slot's
    tensors hold every group's ``i``-th layer, each in its own group's blocks."""
    slots = allocate_kv_caches(grouping.layers_per_block, num_blocks, block_size, num_kv_heads, head_size, dtype,
                               device, value_head_size=value_head_size)
    caches = []
    for layer in range(num_layers):
        group, slot = grouping.group_and_slot(layer)
        caches.append(GroupKVCache(*slots[slot], group))
    return caches


def kv_cache_bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_size: int,
                             dtype: torch.dtype, value_head_size: int | None = None) -> int:
    """Bytes one block costs across all layers, keys and values: what a memory budget divides by.
    ``value_head_size`` as for ``allocate_kv_caches`` (0: the keys' tensor serves the values too)."""
    element_size = torch.empty((), dtype=dtype).element_size()
    value_head_size = head_size if value_head_size is None else value_head_size
    return num_layers * block_size * num_kv_heads * (head_size + value_head_size) * element_size
