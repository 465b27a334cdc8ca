"""Allocation of the per-layer paged KV caches in the layout every backend reads."""

from __future__ import annotations

import torch

from engine.runner.attention.backend import KVCache


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


def kv_cache_bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_size: int,
                             dtype: torch.dtype) -> int:
    """Bytes one block costs across all layers, keys and values: what a memory budget divides by."""
    element_size = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * block_size * num_kv_heads * head_size * element_size
