"""A random mixed batch over a paged KV cache, built adversarially, for kernel tests and benchmarks.

Adversarial on purpose, so that a kernel that reads or writes the wrong place fails loudly:

* physical blocks are a random permutation (block tables are neither sorted nor contiguous), with
  spare blocks that belong to no request;
* every cache slot that holds no valid key yet (the new tokens' slots, the tails of last blocks,
  spare blocks) is poisoned with NaN, and block-table entries past a request's last block point at a
  poisoned spare block, so any read of them shows up as NaN in the output;
* padding can be added: query rows with slot -1 that belong to no request, and requests with no
  query tokens and ``seq_len`` 0 (what a batch padded to a CUDA-graph size looks like).

Each request is ``(context_len, query_len)``: ``context_len`` keys are already in the cache (written
here, as earlier steps would have), ``query_len`` new tokens come with this step's ``key``/``value``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kernels.fp8 import Scale, is_fp8, quantize_fp8
from kernels.reshape_and_cache import PADDING_SLOT_ID


@dataclass
class PagedBatch:
    query: torch.Tensor  # [num_tokens, num_heads, head_size]
    key: torch.Tensor  # [num_tokens, num_kv_heads, head_size]: the new tokens' keys, not yet in the cache
    value: torch.Tensor
    key_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_size]
    value_cache: torch.Tensor
    slot_mapping: torch.Tensor  # [num_tokens] int64, -1 for padding rows
    query_start_loc: torch.Tensor  # [num_reqs + 1] int32
    seq_lens: torch.Tensor  # [num_reqs] int32
    block_table: torch.Tensor  # [num_reqs, max_num_blocks_per_req] int32
    max_query_len: int
    num_actual_tokens: int


def make_paged_batch(
    shapes: Sequence[tuple[int, int]],
    block_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    *,
    dtype: torch.dtype = torch.float32,
    cache_dtype: torch.dtype | None = None,
    device: torch.device | str = "cpu",
    generator: torch.Generator | None = None,
    num_padded_tokens: int = 0,
    num_padded_reqs: int = 0,
    num_spare_blocks: int = 3,
    k_scale: Scale = 1.0,
    v_scale: Scale = 1.0,
    poison: bool = True,
) -> PagedBatch:
    """Random inputs (drawn on the CPU from ``generator``, then moved to ``device``) for ``shapes``."""
    cache_dtype = cache_dtype or dtype
    blocks_needed = [-(-(context + query) // block_size) for context, query in shapes]
    num_blocks = sum(blocks_needed) + max(num_spare_blocks, 1)
    permutation = torch.randperm(num_blocks, generator=generator).tolist()
    poisoned_block = permutation.pop()  # never owned by a request; pads every block table row
    width = max(blocks_needed, default=0) + 1
    block_table = torch.full((len(shapes) + num_padded_reqs, width), poisoned_block, dtype=torch.int32)
    for req, count in enumerate(blocks_needed):
        block_table[req, :count] = torch.tensor([permutation.pop() for _ in range(count)], dtype=torch.int32)

    fill = float("nan") if poison else 0.0
    cache_shape = (num_blocks, block_size, num_kv_heads, head_size)
    key_cache = torch.full(cache_shape, fill).to(cache_dtype)
    value_cache = torch.full(cache_shape, fill).to(cache_dtype)
    slots = []
    for req, (context_len, query_len) in enumerate(shapes):
        positions = torch.arange(context_len + query_len)
        request_slots = block_table[req, positions // block_size].long() * block_size + positions % block_size
        context_slots = request_slots[:context_len]
        history_keys = torch.randn(context_len, num_kv_heads, head_size, generator=generator)
        history_values = torch.randn(context_len, num_kv_heads, head_size, generator=generator)
        _write(key_cache, context_slots, history_keys, cache_dtype, k_scale)
        _write(value_cache, context_slots, history_values, cache_dtype, v_scale)
        slots.append(request_slots[context_len:])
    slots.append(torch.full((num_padded_tokens,), PADDING_SLOT_ID, dtype=torch.long))
    slot_mapping = torch.cat(slots)

    num_actual_tokens = sum(query for _, query in shapes)
    num_tokens = num_actual_tokens + num_padded_tokens
    query_lens = [query for _, query in shapes] + [0] * num_padded_reqs
    query_start_loc = torch.tensor([0] + query_lens, dtype=torch.long).cumsum(0).to(torch.int32)
    seq_lens = torch.tensor([context + query for context, query in shapes] + [0] * num_padded_reqs, dtype=torch.int32)
    query = torch.randn(num_tokens, num_heads, head_size, generator=generator)
    key = torch.randn(num_tokens, num_kv_heads, head_size, generator=generator)
    value = torch.randn(num_tokens, num_kv_heads, head_size, generator=generator)
    return PagedBatch(
        query=query.to(device=device, dtype=dtype), key=key.to(device=device, dtype=dtype),
        value=value.to(device=device, dtype=dtype), key_cache=key_cache.to(device),
        value_cache=value_cache.to(device), slot_mapping=slot_mapping.to(device),
        query_start_loc=query_start_loc.to(device), seq_lens=seq_lens.to(device), block_table=block_table.to(device),
        max_query_len=max(query_lens, default=0), num_actual_tokens=num_actual_tokens,
    )


def _write(cache: torch.Tensor, slots: torch.Tensor, values: torch.Tensor, cache_dtype: torch.dtype,
           scale: Scale) -> None:
    flat = cache.view(-1, *cache.shape[2:])
    flat[slots] = quantize_fp8(values, scale) if is_fp8(cache_dtype) else values.to(cache_dtype)
