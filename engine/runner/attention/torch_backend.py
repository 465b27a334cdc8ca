"""Paged attention in plain torch: correct on CPU and CUDA for mixed prefill + decode batches.

Two paths, because the two kinds of request have different shapes of work:

* Decodes (query length 1) are batched by similar context length (see decode_groups.py): a group's
  keys/values are gathered from the block table into a padded ``[n, max_len, Hkv, D]`` scratch tensor and
  attended in one SDPA call with a length mask.
  GQA is handled without repeating K/V: the query is viewed as ``[B, Hkv, group, D]``, i.e. the group's
  query heads play the role of a query sequence, which is exact because a single token has no causal
  structure among its heads.
* Prefill chunks are handled one request at a time with a causal mask shifted by the context length:
  query ``j`` sits at position ``ctx + j`` and sees keys ``0 .. ctx + j``. A chunk is attended in slices
  of ``PREFILL_QUERY_SLICE`` query rows, each against the keys up to its own last position only.

Why slices: SDPA on the CPU takes its math path for a masked float32 call, which materializes the whole
``[heads, query, keys]`` score matrix. Measured on a CPU with a 32 MiB last-level cache (small model's
8 heads, one thread), a query-key pair cost ~46 ns while that matrix fitted the cache and ~75 ns once it
outgrew it (a 1024-token fresh prompt: 32 MiB of scores per layer). Slices of 128 rows keep the matrix
within 16 MiB up to 4,096 keys at 8 heads, so a pair costs the same in a short and a long chunk, and the
keys past a slice's last query are never scored: a fresh 1024-token prompt's attention took 27 ms per
layer instead of 77. GQA is attended without repeating K/V, as for decodes: a slice's query heads of
one KV head are stacked along the query dimension, each copy of the slice's mask with them.
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
# Query rows of a prefill chunk scored at once (module docstring). The simulator's step feature
# ``prefill_attention_sliced_work`` restates this rule (sim/cost_models/step_batch.py); a test keeps
# the two equal.
PREFILL_QUERY_SLICE = 128


class TorchAttentionBackend(AttentionBackend):
    name = "torch"
    supports_sinks = True
    supports_bidirectional_spans = True

    def __init__(self) -> None:
        # Scratch for the gathered decode keys/values, reused by every layer and step: allocating tens
        # of megabytes afresh per call costs more in page faults than the gather itself. Layers run one
        # after another, so one pair of buffers per (device, dtype) is enough.
        self._workspace: dict[tuple[torch.device, torch.dtype, str], torch.Tensor] = {}

    def attend(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
               metadata: AttentionMetadata, scale: float, output: torch.Tensor,
               sliding_window: int | None = None, logits_soft_cap: float | None = None,
               sinks: torch.Tensor | None = None) -> None:
        split = metadata.split
        if split.decode_req_indices:
            self._attend_decodes(query, key_cache, value_cache, metadata, scale, output, sliding_window,
                                 logits_soft_cap, sinks)
        for req in split.prefill_req_indices:
            self._attend_prefill(req, query, key_cache, value_cache, metadata, scale, output, sliding_window,
                                 logits_soft_cap, sinks)

    def _scratch(self, name: str, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        numel = math.prod(shape)
        key = (like.device, like.dtype, name)
        buffer = self._workspace.get(key)
        if buffer is None or buffer.numel() < numel:
            buffer = self._workspace[key] = torch.empty(numel, dtype=like.dtype, device=like.device)
        return buffer[:numel].view(shape)

    def _attend_decodes(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                        metadata: AttentionMetadata, scale: float, output: torch.Tensor,
                        sliding_window: int | None, logits_soft_cap: float | None,
                        sinks: torch.Tensor | None) -> None:
        num_blocks, block_size, num_kv_heads, head_size = key_cache.shape
        group_size = query.shape[1] // num_kv_heads
        # Gathered keys and values of one group: at most GROUP_GATHER_BYTES (see decode_groups.py).
        max_group_tokens = GROUP_GATHER_BYTES // (2 * num_kv_heads * head_size * key_cache.element_size())
        for group in metadata.decode_groups(block_size, max(max_group_tokens, block_size), sliding_window):
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
            # A query row here is one head: head kv * group_size + g sits at [kv, g].
            out = scaled_dot_product(q, keys.to(q.dtype), values.to(q.dtype), attn_mask=group.attn_mask, scale=scale,
                                     soft_cap=logits_soft_cap,
                                     sinks=None if sinks is None else sinks.view(num_kv_heads, group_size, 1))
            output[group.token_indices] = out.reshape(num_decodes, num_kv_heads * group_size, head_size)

    def _attend_prefill(self, req: int, query: torch.Tensor, key_cache: torch.Tensor,
                        value_cache: torch.Tensor, metadata: AttentionMetadata, scale: float,
                        output: torch.Tensor, sliding_window: int | None, logits_soft_cap: float | None,
                        sinks: torch.Tensor | None) -> None:
        num_blocks, block_size, num_kv_heads, head_size = key_cache.shape
        start, end = metadata.query_start_loc_cpu[req], metadata.query_start_loc_cpu[req + 1]
        query_len, seq_len = end - start, metadata.seq_lens_cpu[req]
        context_len = seq_len - query_len
        num_heads = query.shape[1]
        group_size = num_heads // num_kv_heads
        window = seq_len if sliding_window is None else sliding_window

        # Only the slots from the block of the chunk's first visible key up to seq_len are gathered, and
        # all of them were written by now (the context by earlier steps or a prefix-cache hit, the chunk
        # itself just before attending). Keys before a sliding window's start are never read: their blocks
        # may be freed. ``offset`` is the absolute position of gathered key 0.
        first_block = max(0, context_len - window + 1) // block_size
        offset = first_block * block_size
        block_ids = metadata.block_table[req, first_block:-(-seq_len // block_size)].to(torch.long)
        keys = key_cache[block_ids].reshape(-1, num_kv_heads, head_size)[:seq_len - offset].to(query.dtype)  # [seq - offset, Hkv, D]
        values = value_cache[block_ids].reshape(-1, num_kv_heads, head_size)[:seq_len - offset].to(query.dtype)
        keys_by_head = values_by_head = None  # [Hkv, seq - offset, D], made on the first masked slice
        key_positions = torch.arange(offset, seq_len, device=query.device)
        spans = chunk_spans(metadata, req, context_len, seq_len)
        for slice_start in range(0, query_len, PREFILL_QUERY_SLICE):
            slice_end = min(query_len, slice_start + PREFILL_QUERY_SLICE)
            rows = slice_end - slice_start
            # The slice's last query sits at position context_len + slice_end - 1: later keys are all masked
            # (but those of a span both ways its queries reach); its first sits at context_len + slice_start, and
            # with a window earlier keys than that one's first are masked too. Gathered keys [first_key,
            # last_key) cover exactly the slice's visible ones.
            slice_spans = [(low, high) for low, high in spans
                           if low < context_len + slice_end and high > context_len + slice_start]
            last_key = max([context_len + slice_end, *(high for _, high in slice_spans)]) - offset
            first_key = max(0, context_len + slice_start - window + 1 - offset)
            if last_key == rows and rows <= window and not slice_spans:
                # A fresh prompt's first slice within the window: plain causal attention, no mask to build
                # (measured: small fresh prompts, the common case, ran ~12% slower through the masked path below).
                q = query[start:start + rows].transpose(0, 1)  # [Hq, rows, D]
                out = scaled_dot_product(q, keys[:rows].repeat_interleave(group_size, dim=1).transpose(0, 1),
                                         values[:rows].repeat_interleave(group_size, dim=1).transpose(0, 1),
                                         is_causal=True, scale=scale, soft_cap=logits_soft_cap,
                                         sinks=None if sinks is None else sinks.view(num_heads, 1, 1))
                output[start:start + rows] = out.transpose(0, 1)
                continue
            if keys_by_head is None:
                keys_by_head, values_by_head = keys.transpose(0, 1).contiguous(), values.transpose(0, 1).contiguous()
            query_positions = context_len + torch.arange(slice_start, slice_end, device=query.device)
            visible_positions = key_positions[None, first_key:last_key]
            mask = visible_positions <= query_positions[:, None]  # [rows, last_key - first_key]
            for low, high in slice_spans:
                # transformers' Gemma 3: OR(causal, same image), then AND the window.
                mask |= (((query_positions >= low) & (query_positions < high))[:, None]
                         & (visible_positions >= low) & (visible_positions < high))
            if sliding_window is not None:
                mask &= visible_positions > query_positions[:, None] - sliding_window
            # [rows, Hq, D] -> [Hkv, group * rows, D]: query head h reads KV head h // group_size.
            q = (query[start + slice_start:start + slice_end].view(rows, num_kv_heads, group_size, head_size)
                 .permute(1, 2, 0, 3).reshape(num_kv_heads, group_size * rows, head_size))
            # Row g * rows + r of KV head kv is query head kv * group_size + g.
            slice_sinks = None if sinks is None else (
                sinks.view(num_kv_heads, group_size, 1, 1).expand(-1, -1, rows, -1).reshape(num_kv_heads, -1, 1))
            out = scaled_dot_product(q, keys_by_head[:, first_key:last_key], values_by_head[:, first_key:last_key],
                                     attn_mask=mask.repeat(group_size, 1), scale=scale, soft_cap=logits_soft_cap,
                                     sinks=slice_sinks)
            output[start + slice_start:start + slice_end] = (
                out.view(num_kv_heads, group_size, rows, head_size).permute(2, 0, 1, 3).reshape(rows, num_heads, head_size))


def chunk_spans(metadata: AttentionMetadata, req: int, context_len: int, seq_len: int) -> list[tuple[int, int]]:
    """Request ``req``'s spans attended both ways that meet its chunk [context_len, seq_len). A span must end within
    the chunk (its later keys are not computed yet otherwise): one that does not is a broken promise of the
    scheduler's (disable_chunked_mm_input), raised rather than attended wrong."""
    if not metadata.bidirectional_spans:
        return []
    spans = [(low, high) for low, high in metadata.bidirectional_spans[req] if low < seq_len and high > context_len]
    for low, high in spans:
        if high > seq_len:
            raise RuntimeError(f"request row {req}: a span attended both ways [{low}, {high}) runs past its chunk's end "
                               f"{seq_len}; such items must be prefilled whole (disable_chunked_mm_input)")
    return spans


def scaled_dot_product(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                       attn_mask: torch.Tensor | None = None, is_causal: bool = False, scale: float,
                       soft_cap: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """SDPA (``attn_mask``: True = attend; ``is_causal`` for square score matrices only), or with ``soft_cap`` or
    ``sinks`` the same attention written out, because SDPA can do neither: ``cap * tanh(scale * q.k / cap)``, then
    the mask, then a float32 softmax, as transformers' Gemma 2 computes it; ``sinks`` (one logit per query row,
    shaped like the scores' [..., :1]) join each row's softmax as a column of their own, then are dropped, as in
    transformers' gpt-oss."""
    if soft_cap is None and sinks is None:
        return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, is_causal=is_causal, scale=scale)
    scores = torch.matmul(query, key.transpose(-1, -2)) * scale
    if soft_cap is not None:
        scores = torch.tanh(scores / soft_cap) * soft_cap
    if is_causal:
        attn_mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    if sinks is not None:
        scores = torch.cat((scores, sinks.to(scores.dtype).expand(*scores.shape[:-1], 1)), dim=-1)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    if sinks is not None:
        weights = weights[..., :-1]
    return torch.matmul(weights, value)
