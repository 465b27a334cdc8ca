"""Paged attention over a mixed batch (torch reference, the source of truth for the Triton kernel).

The batch is flat, as in ``engine/runner/attention/metadata.py``: request ``i`` owns query rows
``query_start_loc[i]:query_start_loc[i+1]`` and has ``seq_lens[i]`` tokens in the cache after this
step's write; its ``query_len`` new tokens are the last ones, so query ``j`` sits at position
``context_len + j`` (``context_len = seq_len - query_len``) and attends keys ``0 .. context_len + j``
(causal with the chunk's offset; a decode is the case ``query_len == 1``). Keys are read only through
``block_table``: token ``p`` of request ``i`` lives in block ``block_table[i, p // block_size]`` at offset
``p % block_size``. GQA: query head ``h`` reads kv head ``h // (num_heads // num_kv_heads)``.

Sliding window (``sliding_window=W``, a sliding-window layer's): a query at position ``p`` attends keys
``max(0, p - W + 1) .. p`` only, ``W`` keys counting itself (transformers' ``kv_idx > q_idx - W``).
Keys before the window of a request's *first* query are never read, not even through the block table:
the KV-block manager may have freed their blocks, whose table entries then point at a null block
holding anything, NaN included. ``None`` is full causal attention.

Logit soft-capping (``logits_soft_cap=C``, Gemma 2's ``attn_logit_softcapping``): each scaled score
``s = scale * q.k`` becomes ``C * tanh(s / C)``, squashing it into ``(-C, C)``, *before* the causal and
window mask (as transformers' Gemma 2 eager attention orders it; capping after the mask would turn a
masked ``-inf`` into a finite ``-C``), then softmax. ``None`` leaves the scores as they are.

Attention sinks (``sinks``, gpt-oss's: one logit per query head, [num_heads]): head ``h``'s softmax gets one more
term, ``exp(sinks[h])``, in its denominator, for a "key" with no value, so the weights on real keys sum to less
than 1. ``None``: no sinks.

Requests with ``query_len == 0`` (padding up to a captured batch size) produce nothing, and rows of
``output`` that belong to no request are left untouched.

This is written for clarity, one request at a time in float32, not for speed.
"""

from __future__ import annotations

import math
import numbers

import torch

from kernels.fp8 import Scale, is_fp8


def paged_attention_reference(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    output: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    scale: float,
    k_scale: Scale = 1.0,
    v_scale: Scale = 1.0,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> None:
    """query/output [num_tokens, num_heads, head_size]; caches [num_blocks, block_size, num_kv_heads, head_size].

    An fp8 cache is read as ``stored * k_scale`` / ``stored * v_scale``; other caches ignore the scales.
    ``sliding_window``, ``logits_soft_cap``, ``sinks``: see the module docstring (None: full causal attention, no
    cap, no sinks).
    """
    check_paged_attention_args(query, key_cache, value_cache, output, query_start_loc, seq_lens, block_table)
    check_sliding_window(sliding_window)
    check_logits_soft_cap(logits_soft_cap)
    block_size = key_cache.shape[1]
    group = query.shape[1] // key_cache.shape[2]
    fp8 = is_fp8(key_cache.dtype)
    starts = query_start_loc.tolist()
    for req, seq_len in enumerate(seq_lens.tolist()):
        start, end = starts[req], starts[req + 1]
        query_len = end - start
        if query_len == 0:
            continue
        context_len = seq_len - query_len
        # The first query's window starts earliest: nothing before it is gathered (it may be freed).
        first_key = 0 if sliding_window is None else max(0, context_len - sliding_window + 1)
        positions = torch.arange(first_key, seq_len, device=query.device)
        blocks = block_table[req].to(torch.long)[positions // block_size]
        keys = key_cache[blocks, positions % block_size].float()  # [seq_len - first_key, Hkv, D]
        values = value_cache[blocks, positions % block_size].float()
        if fp8:
            keys, values = keys * k_scale, values * v_scale
        keys = keys.repeat_interleave(group, dim=1)
        values = values.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", query[start:end].float(), keys) * scale
        if logits_soft_cap is not None:
            scores = logits_soft_cap * torch.tanh(scores / logits_soft_cap)  # before the mask: masked stays -inf
        query_positions = (context_len + torch.arange(query_len, device=query.device))[:, None]
        visible = positions[None, :] <= query_positions
        if sliding_window is not None:
            visible &= positions[None, :] > query_positions - sliding_window
        scores = scores.masked_fill(~visible, float("-inf"))
        if sinks is not None:  # a column per head that takes its share of the softmax, then is dropped
            sink_column = sinks.float()[:, None, None].expand(-1, query_len, 1)
            weights = torch.cat((scores, sink_column), dim=-1).softmax(-1)[..., :-1]
        else:
            weights = scores.softmax(-1)
        output[start:end] = torch.einsum("hqk,khd->qhd", weights, values).to(output.dtype)


def check_sliding_window(sliding_window: int | None) -> None:
    """A window holds at least the query's own key; None means no window."""
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be a positive int or None, got {sliding_window!r}")


def check_logits_soft_cap(logits_soft_cap: float | None) -> None:
    """A cap is a finite positive number (a bool is not one); None means no capping.

    Zero would divide by zero; a negative cap caps like its absolute value (tanh is odd), so it can only
    be a mistake upstream; an infinite one gives ``inf * tanh(0)``, NaN, rather than "no cap".
    """
    if logits_soft_cap is None:
        return
    if (isinstance(logits_soft_cap, bool) or not isinstance(logits_soft_cap, numbers.Real)
            or not 0 < logits_soft_cap < math.inf):
        raise ValueError(f"logits_soft_cap must be a finite positive number or None, got {logits_soft_cap!r}")


def check_paged_attention_args(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                               output: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                               block_table: torch.Tensor) -> None:
    """The shape rules every implementation enforces, with the same messages."""
    if query.dim() != 3 or output.shape != query.shape:
        raise ValueError(f"query and output must be [num_tokens, num_heads, head_size] of one shape, got "
                         f"{tuple(query.shape)} and {tuple(output.shape)}")
    if key_cache.dim() != 4 or key_cache.shape != value_cache.shape or key_cache.dtype != value_cache.dtype:
        raise ValueError(f"caches must be two [num_blocks, block_size, num_kv_heads, head_size] tensors of one "
                         f"shape and dtype, got {tuple(key_cache.shape)} {key_cache.dtype} and "
                         f"{tuple(value_cache.shape)} {value_cache.dtype}")
    num_heads, head_size = query.shape[1:]
    num_kv_heads = key_cache.shape[2]
    if key_cache.shape[3] != head_size:
        raise ValueError(f"query head_size {head_size} differs from the cache's {key_cache.shape[3]}")
    if num_heads % num_kv_heads != 0:
        raise ValueError(f"{num_heads} query heads are not a multiple of {num_kv_heads} kv heads")
    num_reqs = seq_lens.shape[0]
    # A block table may have spare rows (a persistent per-slot buffer); it must not have too few.
    if query_start_loc.shape != (num_reqs + 1,) or block_table.dim() != 2 or block_table.shape[0] < num_reqs:
        raise ValueError(f"query_start_loc {tuple(query_start_loc.shape)}, seq_lens {tuple(seq_lens.shape)} and "
                         f"block_table {tuple(block_table.shape)} disagree on the number of requests")
