"""The runner's side of KV offloading: a KV cache in host memory and the block copies to and from it.

The scheduler decides every copy (engine/core/kv_offload.py); the runner makes them at the start of a step,
in this order (``ModelRunner.execute_model``):

1. stores: GPU block -> host slot, for blocks whose KV an earlier step computed. First, because a block
   freed since may be handed to another request in this very step and zeroed or overwritten below;
2. the step's zeroing of newly allocated blocks;
3. loads: host slot -> GPU block, into blocks allocated for a loading request (zeroed in 2 when new). After
   the stores, because a slot evicted and reused in the same update holds its new hash's KV only once 1 ran.

All copies here are synchronous, so a load is done within the step that starts it, and the runner reports
it back at once (``ModelRunnerOutput.finished_kv_loads``). On a GPU the host cache is pinned memory; the
blocks are gathered (``index_select``) into a staging tensor on one side before crossing, so a copy is not
one DMA transfer, and it blocks the step (vLLM overlaps its loads with the steps on a stream of their own).
On a CPU they are plain copies between two tensors. The scheduler hands out one copy per host slot per
step (``KVCacheManager.take_offload_stores``): ``index_copy_`` with a repeated index may keep either value.
"""

from __future__ import annotations

import torch

from engine.runner.attention.kv_cache import KVCache, allocate_kv_caches


class HostKVCache:
    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
                 dtype: torch.dtype, device: torch.device, value_head_size: int | None = None) -> None:
        """``value_head_size`` as for ``allocate_kv_caches`` (0: a layer's one tensor serves keys and values)."""
        if device.type == "cuda":
            # Allocated pinned at once (pinning a pageable tensor would copy it, doubling the peak).
            shape = (num_blocks, block_size, num_kv_heads, head_size)
            def pinned() -> torch.Tensor:
                return torch.zeros(shape, dtype=dtype, pin_memory=True)
            caches = [(key, key) if value_head_size == 0 else (key, pinned())
                      for key in (pinned() for _ in range(num_layers))]
        else:
            caches = allocate_kv_caches(num_layers, num_blocks, block_size, num_kv_heads, head_size, dtype, "cpu",
                                        value_head_size=value_head_size)
        self.caches: list[KVCache] = caches
        self.num_blocks = num_blocks
        self.device = device

    def store(self, device_caches: list[KVCache], stores: list[tuple[int, int]]) -> None:
        """Copy each (device block id, host slot) pair's block to the host."""
        if not stores:
            return
        block_ids = torch.tensor([block_id for block_id, _ in stores], dtype=torch.long, device=self.device)
        slots = torch.tensor([slot for _, slot in stores], dtype=torch.long)
        for (host_key, host_value), (key, value) in zip(self.caches, device_caches):
            host_key.index_copy_(0, slots, key.index_select(0, block_ids).to("cpu"))
            host_value.index_copy_(0, slots, value.index_select(0, block_ids).to("cpu"))

    def load(self, device_caches: list[KVCache], loads: dict[str, list[tuple[int, int]]]) -> list[str]:
        """Copy each request's (host slot, device block id) pairs back; the ids of the requests loaded."""
        pairs = [pair for request_pairs in loads.values() for pair in request_pairs]
        if pairs:
            slots = torch.tensor([slot for slot, _ in pairs], dtype=torch.long)
            block_ids = torch.tensor([block_id for _, block_id in pairs], dtype=torch.long, device=self.device)
            for (host_key, host_value), (key, value) in zip(self.caches, device_caches):
                key.index_copy_(0, block_ids, host_key.index_select(0, slots).to(self.device, non_blocking=True))
                value.index_copy_(0, block_ids, host_value.index_select(0, slots).to(self.device, non_blocking=True))
        return list(loads)
