"""Paged attention in plain torch: correct on CPU and CUDA for mixed prefill + decode batches.

Two paths, because the two kinds of request have different shapes of work:

* Decodes (query length 1) are batched by similar context length (see decode_groups.py): a group's
  keys/values are gathered from the block table into a padded ``[n, max_len, Hkv, D]`` scratch tensor and
  attended in one SDPA call with a length mask.
  GQA is handled without repeating K/V: the query is viewed as ``[B, Hkv, group, D]``, i.e. the group's
  query heads play the role of a query sequence, which is exact because a single token has no causal
  structure among its heads.
* Prefill chunks are handled one request at a time with a causal mask shifted by the context length:
  query ``j`` sits at position ``ctx + j`` and sees keys ``0 .. ctx + j``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from engine.runner.attention.backend import AttentionBackend
from engine.runner.attention.metadata import AttentionMetadata


# A decode group's gathered K and V stay within this many bytes, small enough to stay in a CPU's
# last-level cache between the gather and the attention that reads it (decode_groups.py).
GROUP_GATHER_BYTES = 8 * 2**20


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def __init__(self) -> None:
        # Scratch for the gathered decode keys/values, reused by every layer and step: allocating tens
        # of megabytes afresh per call costs more in page faults than the gather itself. Layers run one
        # after another, so one pair of buffers per (device, dtype) is enough.
        self._workspace: dict[tuple[torch.device, torch.dtype, str], torch.Tensor] = {}

    def attend(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
               metadata: AttentionMetadata, scale: float, output: torch.Tensor) -> None:
        split = metadata.split
        if split.decode_req_indices:
            self._attend_decodes(query, key_cache, value_cache, metadata, scale, output)
        for req in split.prefill_req_indices:
            self._attend_prefill(req, query, key_cache, value_cache, metadata, scale, output)

    def _scratch(self, name: str, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        numel = math.prod(shape)
        key = (like.device, like.dtype, name)
        buffer = self._workspace.get(key)
        if buffer is None or buffer.numel() < numel:
            buffer = self._workspace[key] = torch.empty(numel, dtype=like.dtype, device=like.device)
        return buffer[:numel].view(shape)

    def _attend_decodes(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                        metadata: AttentionMetadata, scale: float, output: torch.Tensor) -> None:
        num_blocks, block_size, num_kv_heads, head_size = key_cache.shape
        group_size = query.shape[1] // num_kv_heads
        # Gathered keys and values of one group: at most GROUP_GATHER_BYTES (see decode_groups.py).
        max_group_tokens = GROUP_GATHER_BYTES // (2 * num_kv_heads * head_size * key_cache.element_size())
        for group in metadata.decode_groups(block_size, max(max_group_tokens, block_size)):
            num_decodes, max_len = group.num_reqs, group.num_blocks * block_size
            # [n * blocks] physical ids -> [n, max_len, Hkv, D] gathered keys/values.
            block_shape = (group.block_ids.shape[0], block_size, num_kv_heads, head_size)
            keys = torch.index_select(key_cache, 0, group.block_ids, out=self._scratch("key", block_shape, key_cache))
            values = torch.index_select(value_cache, 0, group.block_ids,
                                        out=self._scratch("value", block_shape, value_cache))
            keys = keys.view(num_decodes * max_len, num_kv_heads, head_size)
            values = values.view(num_decodes * max_len, num_kv_heads, head_size)
            if group.padding_indices.numel():
                # Slots past a request's length were never written for it and may hold anything, NaN
                # included; a zero attention weight does not neutralize NaN (0 * NaN = NaN).
                keys.index_fill_(0, group.padding_indices, 0)
                values.index_fill_(0, group.padding_indices, 0)
            keys = keys.view(num_decodes, max_len, num_kv_heads, head_size).transpose(1, 2)  # [B, Hkv, L, D]
            values = values.view(num_decodes, max_len, num_kv_heads, head_size).transpose(1, 2)
            q = query[group.token_indices].view(num_decodes, num_kv_heads, group_size, head_size)
            out = F.scaled_dot_product_attention(q, keys.to(q.dtype), values.to(q.dtype), attn_mask=group.attn_mask,
                                                 scale=scale)
            output[group.token_indices] = out.reshape(num_decodes, num_kv_heads * group_size, head_size)

    def _attend_prefill(self, req: int, query: torch.Tensor, key_cache: torch.Tensor,
                        value_cache: torch.Tensor, metadata: AttentionMetadata, scale: float,
                        output: torch.Tensor) -> None:
        num_blocks, block_size, num_kv_heads, head_size = key_cache.shape
        start, end = metadata.query_start_loc_cpu[req], metadata.query_start_loc_cpu[req + 1]
        query_len, seq_len = end - start, metadata.seq_lens_cpu[req]
        context_len = seq_len - query_len
        num_heads = query.shape[1]

        # Only the first seq_len slots are gathered, and all of them were written by now (the context
        # by earlier steps or a prefix-cache hit, the chunk itself just before attending).
        block_ids = metadata.block_table[req, :-(-seq_len // block_size)].to(torch.long)
        keys = key_cache[block_ids].reshape(-1, num_kv_heads, head_size)[:seq_len]
        values = value_cache[block_ids].reshape(-1, num_kv_heads, head_size)[:seq_len]
        if num_heads != num_kv_heads:
            keys = keys.repeat_interleave(num_heads // num_kv_heads, dim=1)
            values = values.repeat_interleave(num_heads // num_kv_heads, dim=1)

        q = query[start:end].transpose(0, 1)  # [Hq, query_len, D]
        k, v = keys.transpose(0, 1).to(q.dtype), values.transpose(0, 1).to(q.dtype)
        if context_len == 0:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        else:
            query_pos = context_len + torch.arange(query_len, device=query.device)
            mask = torch.arange(seq_len, device=query.device)[None, :] <= query_pos[:, None]  # [q, seq]
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        output[start:end] = out.transpose(0, 1)
