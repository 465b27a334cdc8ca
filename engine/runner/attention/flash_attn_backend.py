"""FlashAttention-2 backend (CUDA only; ``flash-attn`` is imported lazily so the project imports without it).

Upstream flash-attn 2.x reads a paged cache through ``block_table`` only when the page size is a
multiple of 256 (vLLM's fork lifts this; upstream does not). For such block sizes the cache is read
in place. For smaller blocks (vLLM's usual 16) the step's keys/values are gathered into contiguous
varlen tensors first, which costs a copy but keeps one kernel and identical semantics. In both cases
``causal=True`` means bottom-right alignment, i.e. query ``j`` of a chunk with context ``ctx`` sees
keys ``0 .. ctx + j``, exactly the paged semantics of the torch reference.
"""

from __future__ import annotations

import torch

from engine.runner.attention.backend import AttentionBackend
from engine.runner.attention.metadata import AttentionMetadata

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
               metadata: AttentionMetadata, scale: float, output: torch.Tensor) -> None:
        if not query.is_cuda:
            raise RuntimeError("attention backend 'flash_attn' got CPU tensors; use attention backend 'torch'")
        if query.dtype not in (torch.float16, torch.bfloat16):
            raise RuntimeError(f"attention backend 'flash_attn' supports float16/bfloat16, got {query.dtype}")
        num_tokens = metadata.num_actual_tokens
        block_size = key_cache.shape[1]
        cu_seqlens_k = metadata.get_seq_start_loc()
        if block_size % FLASH_ATTN_PAGE_MULTIPLE == 0:
            keys, values, block_table = key_cache, value_cache, metadata.block_table
        else:
            keys, values = _gather_contiguous(key_cache, value_cache, metadata)
            block_table = None
        output[:num_tokens] = self._flash_attn_varlen_func(
            query[:num_tokens],
            keys,
            values,
            cu_seqlens_q=metadata.query_start_loc,
            cu_seqlens_k=cu_seqlens_k,
            max_seqlen_q=metadata.max_query_len,
            max_seqlen_k=metadata.max_seq_len,
            softmax_scale=scale,
            causal=True,
            block_table=block_table,
        )


def _gather_contiguous(key_cache: torch.Tensor, value_cache: torch.Tensor,
                       metadata: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
    """Every request's keys/values, concatenated in request order: [sum(seq_lens), Hkv, D]."""
    num_blocks, block_size, num_kv_heads, head_size = key_cache.shape
    seq_lens = metadata.seq_lens.to(torch.long)
    total = sum(metadata.seq_lens_cpu)
    req = torch.repeat_interleave(torch.arange(metadata.num_reqs, device=seq_lens.device), seq_lens,
                                  output_size=total)
    starts = metadata.get_seq_start_loc().to(torch.long)[:-1]
    position = torch.arange(total, device=seq_lens.device) - starts[req]
    slots = metadata.block_table[req, position // block_size].to(torch.long) * block_size + position % block_size
    flat_shape = (num_blocks * block_size, num_kv_heads, head_size)
    return key_cache.view(flat_shape)[slots], value_cache.view(flat_shape)[slots]
