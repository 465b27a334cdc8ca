"""FlashAttention-2 backend (CUDA only; ``flash-attn`` is imported lazily so the project imports without it).

Upstream flash-attn 2.x reads a paged cache through ``block_table`` only when the page size is a
multiple of 256 (vLLM's fork lifts this; upstream does not). For such block sizes the cache is read
in place. For smaller blocks (vLLM's usual 16) the step's keys/values are gathered into contiguous
varlen tensors first, which costs a copy but keeps one kernel and identical semantics. In both cases
``causal=True`` means bottom-right alignment, i.e. query ``j`` of a chunk with context ``ctx`` sees
keys ``0 .. ctx + j``, exactly the paged semantics of the torch reference.

A sliding window ``W`` is flash-attn's ``window_size=(W - 1, 0)``: ``W - 1`` keys to the left of the
query's own. Paged in place, flash-attn starts each query tile at the key tile of its window, and its
key tiles never straddle a page, so pages freed before a window are not read. The gathered path copies
each request's keys from its first query's window start on only: flash-attn masks earlier keys in a
tile it does read, but a NaN in a freed block's value would still reach the output as ``0 * NaN``.
"""

from __future__ import annotations

import itertools

import torch

from engine.runner.attention.backend import AttentionBackend
from engine.runner.attention.metadata import AttentionMetadata
from kernels.paged_attention import check_logits_soft_cap

FLASH_ATTN_PAGE_MULTIPLE = 256


class FlashAttentionBackend(AttentionBackend):
    name = "flash_attn"

    def __init__(self) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError(
                "attention backend 'flash_attn' needs a CUDA device, and none is available; "
                "use attention backend 'torch' on CPU")
        try:
            from flash_attn import flash_attn_varlen_func
        except ImportError as error:
            raise RuntimeError(
                "attention backend 'flash_attn' was requested but the flash-attn package is not installed "
                "(pip install 'servesim[gpu]'); use attention backend 'torch' instead") from error
        self._flash_attn_varlen_func = flash_attn_varlen_func

    def attend(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
               metadata: AttentionMetadata, scale: float, output: torch.Tensor,
               sliding_window: int | None = None, logits_soft_cap: float | None = None,
               sinks: torch.Tensor | None = None) -> None:
        if not query.is_cuda:
            raise RuntimeError("attention backend 'flash_attn' got CPU tensors; use attention backend 'torch'")
        if query.dtype not in (torch.float16, torch.bfloat16):
            raise RuntimeError(f"attention backend 'flash_attn' supports float16/bfloat16, got {query.dtype}")
        check_logits_soft_cap(logits_soft_cap)  # flash-attn would read 0 (or a bad cap) as "no cap"
        num_tokens = metadata.num_actual_tokens
        block_size = key_cache.shape[1]
        if block_size % FLASH_ATTN_PAGE_MULTIPLE == 0:
            keys, values, block_table = key_cache, value_cache, metadata.block_table
            cu_seqlens_k, max_seqlen_k = metadata.get_seq_start_loc(), metadata.max_seq_len
        else:
            keys, values, cu_seqlens_k, max_seqlen_k = _gather_contiguous(key_cache, value_cache, metadata,
                                                                          sliding_window)
            block_table = None
        output[:num_tokens] = self._flash_attn_varlen_func(
            query[:num_tokens],
            keys,
            values,
            cu_seqlens_q=metadata.query_start_loc,
            cu_seqlens_k=cu_seqlens_k,
            max_seqlen_q=metadata.max_query_len,
            max_seqlen_k=max_seqlen_k,
            softmax_scale=scale,
            causal=True,
            window_size=_window_size(sliding_window),
            # flash-attn >= 2.6 caps as cap * tanh(scale * q.k / cap) before its mask; 0.0 means no cap.
            softcap=logits_soft_cap or 0.0,
            block_table=block_table,
        )


def _window_size(sliding_window: int | None) -> tuple[int, int]:
    """flash-attn's (left, right) key counts beside the query's own; -1 is unbounded."""
    return (-1, -1) if sliding_window is None else (sliding_window - 1, 0)


def _gather_contiguous(key_cache: torch.Tensor, value_cache: torch.Tensor, metadata: AttentionMetadata,
                       sliding_window: int | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Every request's readable keys/values, concatenated in request order, with flash-attn's
    ``cu_seqlens_k`` and ``max_seqlen_k`` for them.

    Readable: all of them without a window; with one, those from the request's first query's window start
    on. Dropping keys from the front keeps causal=True's bottom-right alignment, since the query tokens
    are still the last ones of each key run.
    """
    num_blocks, block_size, num_kv_heads, head_size = key_cache.shape
    device = metadata.seq_lens.device
    if sliding_window is None:
        key_lens, key_lens_cpu = metadata.seq_lens.to(torch.long), metadata.seq_lens_cpu
        cu_seqlens_k, max_seqlen_k = metadata.get_seq_start_loc(), metadata.max_seq_len
    else:
        first_keys_cpu = [max(0, context_len - sliding_window + 1) for context_len in metadata.num_computed_tokens_cpu]
        key_lens_cpu = [seq_len - first for seq_len, first in zip(metadata.seq_lens_cpu, first_keys_cpu)]
        key_lens = torch.tensor(key_lens_cpu, dtype=torch.long, device=device)
        cu_seqlens_k = torch.tensor([0, *itertools.accumulate(key_lens_cpu)], dtype=torch.int32, device=device)
        max_seqlen_k = max(key_lens_cpu, default=0)
    total = sum(key_lens_cpu)
    req = torch.repeat_interleave(torch.arange(metadata.num_reqs, device=device), key_lens, output_size=total)
    position = torch.arange(total, device=device) - cu_seqlens_k.to(torch.long)[:-1][req]
    if sliding_window is not None:
        position += torch.tensor(first_keys_cpu, dtype=torch.long, device=device)[req]
    slots = metadata.block_table[req, position // block_size].to(torch.long) * block_size + position % block_size
    flat_shape = (num_blocks * block_size, num_kv_heads, head_size)
    return key_cache.view(flat_shape)[slots], value_cache.view(flat_shape)[slots], cu_seqlens_k, max_seqlen_k
