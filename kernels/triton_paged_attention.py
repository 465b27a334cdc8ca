"""Paged attention for mixed prefill + decode batches as one Triton kernel (plus a split-KV combine).

Same contract as ``kernels/paged_attention.py`` (the reference): flat batch, causal with each chunk's
context offset, GQA, keys and values read only through the block table, an optional sliding window,
an optional logit soft cap.

Work decomposition. The query rows of one request are cut into *query blocks* of ``BLOCK_Q`` tokens; a
program handles one query block for one kv head, i.e. ``BLOCK_Q * group`` query rows (the group's query
heads share every key and value it loads, which is the point of GQA). It walks the request's keys in
tiles of ``TILE_N`` positions, translating each position through the block table, and keeps an online
softmax (running max ``m``, running sum ``l``, unnormalized accumulator) in float32, in base 2.

Finding a program's request without a host sync: request ``i`` is given the query-block ids starting
at ``query_start_loc[i] // BLOCK_Q + i``. That over-counts by at most one block per request, so
``num_tokens // BLOCK_Q + num_reqs`` programs always suffice (a bound known from shapes alone, which CUDA
graph capture needs); a program finds its request by binary search and exits if its block is empty.

Sliding window. ``HAS_WINDOW`` is a compile-time flag (full-attention layers run the very kernel they
ran before windows existed); the window itself is a runtime int, so every window size shares one
compiled variant. A program starts at the key tile holding the window start of its *first* query row
(the earliest of its rows): whole tiles before it are neither loaded nor looked up in the block table,
which is the saving a window buys and also keeps freed (null, garbage) blocks out. Inside the first
tile, loads of positions before that start are masked; each row then masks keys before its own window.

Logit soft cap. ``HAS_SOFT_CAP`` is a compile-time flag like ``HAS_WINDOW`` (uncapped layers run the
kernel they ran before capping existed: the capping code is not in their variant, only an unused
scalar argument is); the cap is a runtime float. Scores live in base 2, ``x = s * log2(e)`` with
``s = scale * q.k``, and the cap must bite on the natural-scale ``s``. Rather than convert back and
forth, the cap is converted instead: with ``C2 = C * log2(e)``, ``C2 * tanh(x / C2) = C * tanh(s / C) *
log2(e)``, exactly the capped natural score in base 2. Triton's language has no tanh in every version:
``_tanh`` below builds one with a small relative error everywhere, so that a cap far above every score
changes the scores by about float32 rounding only (see there). The cap is applied before the mask
sets invisible scores to -inf, as in the reference. Nothing after the scores changes: split partials
and their combine see capped base-2 scores like any others.

Split-KV (flash-decoding). A decode-only step with few requests launches too few programs to fill a
GPU, so the keys of each request may be split into ``num_kv_splits`` segments handled by separate
programs, each writing a partial (max, sum, accumulator); a second kernel combines them. The choice of
split depends on shapes only, never on sequence lengths, so it is the same at capture and at replay.

Importing this module imports triton; import it lazily (see ``kernels/triton_support.py``).
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from kernels.fp8 import Scale, check_scale, is_fp8
from kernels.paged_attention import check_logits_soft_cap, check_paged_attention_args, check_sliding_window
from kernels.triton_support import check_launchable, interpreter_enabled, next_power_of_2

INTERPRETED = interpreter_enabled()  # fixed when the kernels below are decorated, i.e. now
TILE_N = 32  # key positions per inner iteration; independent of the cache's block size
MAX_KV_SPLITS = 16
LOG2_E = 1.4426950408889634


@triton.jit
def _find_request(query_start_loc_ptr, query_block, num_reqs, BLOCK_Q: tl.constexpr):
    """The last request whose first query block is at or before ``query_block``."""
    # Annotated so both bounds are int32 values from the start (num_reqs == 1 arrives as a constant).
    low: tl.int32 = 0
    high: tl.int32 = num_reqs
    while low < high:
        middle = (low + high) // 2
        first_block = tl.load(query_start_loc_ptr + middle) // BLOCK_Q + middle
        if first_block <= query_block:
            low = middle + 1
        else:
            high = middle
    return low - 1


@triton.jit
def _tanh(x):
    """float32 tanh with a relative error of about 1e-6 at worst, NaN-free for finite ``x``.

    Away from 0, ``tanh(x) = 2 * sigmoid(2x) - 1``, where ``sigmoid(z) = 1 / (1 + exp(-z))`` tends to 0
    or 1 for large ``|z|`` (``1 / inf``, never ``inf / inf``), so tanh saturates at -1 or 1. Its
    *absolute* error is about a float32 ulp of 1, though, which near 0 is a large relative error (10%
    at ``|x| = 1e-6``): a soft cap of 1e6 would then move every score by ~0.1 instead of nothing. So for
    ``|x| < 1/4`` the odd Taylor series up to ``x^9`` is used instead; the first term it drops,
    ``(1382/155925) x^11``, is under 1e-8 of ``x`` there, and from ``|x| = 1/4`` on the sigmoid form's
    error is at most a few ulps of 1 over ``tanh(1/4) ~ 0.245``, i.e. about 1e-6 of ``tanh(x)``.
    """
    x_squared = x * x
    series = x * (1.0 + x_squared * (-0.3333333333333333 + x_squared * (0.13333333333333333 + x_squared * (
        -0.05396825396825397 + x_squared * 0.021869488536155203))))
    return tl.where(tl.abs(x) < 0.25, series, 2.0 * tl.sigmoid(2.0 * x) - 1.0)


# Integers that vary from step to step are not specialized on (Triton otherwise compiles a variant for
# values equal to 1 or divisible by 16): a new variant mid-run costs a compilation of ~0.5 s inside a step.
# (Floats such as soft_cap_log2 are never specialized on.)
@triton.jit(do_not_specialize=["num_reqs", "block_table_stride", "sliding_window"])
def _paged_attention_kernel(
    output_ptr, query_ptr, key_cache_ptr, value_cache_ptr,
    block_table_ptr, seq_lens_ptr, query_start_loc_ptr,
    partial_out_ptr, partial_max_ptr, partial_sum_ptr, sinks_ptr, span_start_ptr, span_end_ptr,
    softmax_scale_log2, v_scale, num_reqs, head_size, sliding_window, soft_cap_log2,
    query_stride_token, query_stride_head, output_stride_token, output_stride_head,
    cache_stride_block, cache_stride_offset, cache_stride_head, block_table_stride,
    GROUP: tl.constexpr, GROUP_PADDED: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr,
    HEAD_PADDED: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr,
    NUM_SPLITS: tl.constexpr, DOT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr, HAS_WINDOW: tl.constexpr,
    HAS_SOFT_CAP: tl.constexpr, HAS_SINKS: tl.constexpr, HAS_SPANS: tl.constexpr,
):
    query_block = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    req = _find_request(query_start_loc_ptr, query_block, num_reqs, BLOCK_Q)
    query_start = tl.load(query_start_loc_ptr + req)
    query_len = tl.load(query_start_loc_ptr + req + 1) - query_start
    local_block = query_block - (query_start // BLOCK_Q + req)
    if local_block * BLOCK_Q >= query_len:
        return  # an over-counted block, or a padded request with no query tokens
    seq_len = tl.load(seq_lens_ptr + req)
    context_len = seq_len - query_len

    # Row r is query token (local_block * BLOCK_Q + r // GROUP_PADDED) of the request, query head
    # kv_head * GROUP + r % GROUP_PADDED; rows of padded group slots or past the chunk are masked.
    rows = tl.arange(0, BLOCK_M)
    token_in_request = local_block * BLOCK_Q + rows // GROUP_PADDED
    head_in_group = rows % GROUP_PADDED
    row_valid = (token_in_request < query_len) & (head_in_group < GROUP)
    token = (query_start + token_in_request).to(tl.int64)
    query_head = kv_head * GROUP + head_in_group
    query_position = context_len + token_in_request
    dims = tl.arange(0, HEAD_PADDED)
    dim_valid = dims < head_size
    query = tl.load(query_ptr + token[:, None] * query_stride_token + query_head[:, None] * query_stride_head
                    + dims[None, :], mask=row_valid[:, None] & dim_valid[None, :], other=0.0)
    if DOT_IN_FP32:
        query = query.to(tl.float32)

    # Causality bounds the keys this block needs by its last row's position, not by seq_len; a row inside a span
    # attended both ways (an image of Gemma 3's) sees to the span's end, which lies within the chunk.
    last_token = tl.minimum(query_len, (local_block + 1) * BLOCK_Q)
    num_tiles = tl.cdiv(context_len + last_token, TILE)
    if HAS_SPANS:
        row_span_start = tl.load(span_start_ptr + token, mask=row_valid, other=0)
        row_span_end = tl.load(span_end_ptr + token, mask=row_valid, other=0)
        num_tiles = tl.cdiv(tl.maximum(context_len + last_token, tl.max(row_span_end, 0)), TILE)
    if HAS_WINDOW:
        # The window bounds them from below by the first row's window start (rows only move it later);
        # the splits divide the tiles from there on.
        window_start = tl.maximum(context_len + local_block * BLOCK_Q - sliding_window + 1, 0)
        window_tile = window_start // TILE
        tiles_per_split = tl.cdiv(num_tiles - window_tile, NUM_SPLITS)
        first_tile = window_tile + split * tiles_per_split
    else:
        tiles_per_split = tl.cdiv(num_tiles, NUM_SPLITS)
        first_tile = split * tiles_per_split
    end_tile = tl.minimum(first_tile + tiles_per_split, num_tiles)

    if HAS_SOFT_CAP:
        inverse_cap_log2 = 1.0 / soft_cap_log2  # a multiply per score instead of a division
    running_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    running_sum = tl.zeros([BLOCK_M], tl.float32)
    accumulator = tl.zeros([BLOCK_M, HEAD_PADDED], tl.float32)
    offsets = tl.arange(0, TILE)
    for tile in range(first_tile, end_tile):
        key_position = tile * TILE + offsets
        key_valid = key_position < seq_len
        if HAS_WINDOW:
            key_valid = key_valid & (key_position >= window_start)  # before it: possibly a freed block
        physical_block = tl.load(block_table_ptr + req.to(tl.int64) * block_table_stride + key_position // BLOCK_SIZE,
                                 mask=key_valid, other=0).to(tl.int64)
        slot_offsets = (physical_block * cache_stride_block + (key_position % BLOCK_SIZE) * cache_stride_offset
                        + kv_head * cache_stride_head)
        # Positions past seq_len were never written and may hold anything, NaN included; masking the
        # loads (not just the scores) keeps 0 * NaN out of the accumulator.
        keys = tl.load(key_cache_ptr + slot_offsets[None, :] + dims[:, None],
                       mask=dim_valid[:, None] & key_valid[None, :], other=0.0)  # [HEAD_PADDED, TILE]
        values = tl.load(value_cache_ptr + slot_offsets[:, None] + dims[None, :],
                         mask=key_valid[:, None] & dim_valid[None, :], other=0.0)  # [TILE, HEAD_PADDED]
        # An fp8 cache is widened to the query's dtype (exact); its scales are folded into
        # softmax_scale_log2 and v_scale instead of multiplying every element. (With DOT_IN_FP32 the
        # query is float32 already.)
        keys = keys.to(query.dtype)
        values = values.to(query.dtype)

        scores = tl.dot(query, keys, input_precision=DOT_PRECISION) * softmax_scale_log2
        if HAS_SOFT_CAP:
            # C2 * tanh(x / C2) on base-2 scores (module docstring), before the mask: masked stays -inf.
            scores = soft_cap_log2 * _tanh(scores * inverse_cap_log2)
        visible = key_position[None, :] <= query_position[:, None]
        if HAS_SPANS:
            visible = visible | ((key_position[None, :] >= row_span_start[:, None])
                                 & (key_position[None, :] < row_span_end[:, None]))
        visible = visible & key_valid[None, :]
        if HAS_WINDOW:
            visible = visible & (key_position[None, :] > query_position[:, None] - sliding_window)
        scores = tl.where(visible, scores, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, 1))
        # A row that has seen no visible key yet keeps max -inf; subtracting 0 instead avoids -inf - -inf.
        # (With a window a row may see none in a whole split, or none in a tile after its last key.)
        reference = tl.where(new_max == float("-inf"), 0.0, new_max)
        probabilities = tl.exp2(scores - reference[:, None])
        correction = tl.exp2(running_max - reference)
        running_sum = running_sum * correction + tl.sum(probabilities, 1)
        accumulator = accumulator * correction[:, None] + tl.dot(
            probabilities.to(values.dtype), values, input_precision=DOT_PRECISION)
        running_max = new_max

    accumulator = accumulator * v_scale
    if HAS_SINKS and NUM_SPLITS == 1:
        # The sink joins the denominator once, in the running max's base-2 units (with splits: in the combine).
        sink = tl.load(sinks_ptr + query_head, mask=row_valid, other=0.0)  # float32, base-2 units
        running_sum = running_sum + tl.exp2(sink - running_max)
    if HAS_WINDOW:
        # A masked row past the chunk may have no key in its window (its position is past seq_len); a
        # sum of 1 keeps its never-stored result finite instead of 0 / 0.
        running_sum = tl.where(row_valid, running_sum, 1.0)
    if NUM_SPLITS == 1:
        result = accumulator / running_sum[:, None]
        tl.store(output_ptr + token[:, None] * output_stride_token + query_head[:, None] * output_stride_head
                 + dims[None, :], result.to(output_ptr.dtype.element_ty),
                 mask=row_valid[:, None] & dim_valid[None, :])
    else:
        # Partials are [num_tokens, num_heads, NUM_SPLITS, (HEAD_PADDED)] float32, contiguous.
        partial_row = (token * tl.num_programs(1) * GROUP + query_head) * NUM_SPLITS + split
        tl.store(partial_max_ptr + partial_row, running_max, mask=row_valid)
        tl.store(partial_sum_ptr + partial_row, running_sum, mask=row_valid)
        tl.store(partial_out_ptr + partial_row[:, None] * HEAD_PADDED + dims[None, :], accumulator,
                 mask=row_valid[:, None])


@triton.jit(do_not_specialize=["num_reqs"])
def _combine_splits_kernel(
    output_ptr, partial_out_ptr, partial_max_ptr, partial_sum_ptr, query_start_loc_ptr, sinks_ptr,
    num_reqs, head_size, output_stride_token, output_stride_head,
    NUM_SPLITS: tl.constexpr, SPLITS_PADDED: tl.constexpr, HEAD_PADDED: tl.constexpr, HAS_SINKS: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    if token >= tl.load(query_start_loc_ptr + num_reqs):
        return  # a padding row: no request owns it and no partial was written for it
    splits = tl.arange(0, SPLITS_PADDED)
    split_valid = splits < NUM_SPLITS
    row = (token * tl.num_programs(1) + head) * NUM_SPLITS + splits
    split_max = tl.load(partial_max_ptr + row, mask=split_valid, other=float("-inf"))
    split_sum = tl.load(partial_sum_ptr + row, mask=split_valid, other=0.0)
    # Every query sees its own key, which lies in some split, so the overall max is finite; splits
    # that saw no key of this row (empty, or wholly outside its window) kept max -inf and get weight 0.
    overall_max = tl.max(split_max, 0)
    weight = tl.where(split_max == float("-inf"), 0.0, tl.exp2(split_max - overall_max))
    dims = tl.arange(0, HEAD_PADDED)
    partial = tl.load(partial_out_ptr + row[:, None] * HEAD_PADDED + dims[None, :], mask=split_valid[:, None],
                      other=0.0)
    total = tl.sum(split_sum * weight, 0)
    if HAS_SINKS:  # once per row, against the overall max
        total += tl.exp2(tl.load(sinks_ptr + head) - overall_max)
    result = tl.sum(partial * weight[:, None], 0) / total
    tl.store(output_ptr + token * output_stride_token + head * output_stride_head + dims,
             result.to(output_ptr.dtype.element_ty), mask=dims < head_size)


def triton_paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    output: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    scale: float,
    max_query_len: int,
    k_scale: Scale = 1.0,
    v_scale: Scale = 1.0,
    num_kv_splits: int | None = None,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,
    spans: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """Fill the rows of ``output`` owned by requests, as ``paged_attention_reference`` does.

    ``max_query_len`` (a host int, an upper bound is fine) picks the query-block size; ``num_kv_splits``
    overrides the split-KV choice (None: one split unless a decode-only step leaves the GPU idle).
    ``sliding_window``: as in the reference (None: full causal attention); tiles before a query block's
    window are skipped, not just masked. ``logits_soft_cap``, ``sinks`` ([num_heads]): as in the reference (None:
    no cap, no sinks). ``spans``: per query token, the [start, end) positions of the span it attends both ways
    (end 0: none), int32 [num_tokens] each (AttentionMetadata.bidirectional_spans; the torch backend's rule:
    causal OR the span, then the window); a span must end within its chunk.
    Nothing here reads device memory on the host, so the call can be captured in a CUDA graph.
    """
    check_paged_attention_args(query, key_cache, value_cache, output, query_start_loc, seq_lens, block_table)
    check_sliding_window(sliding_window)
    check_logits_soft_cap(logits_soft_cap)
    check_launchable("triton_paged_attention", INTERPRETED, query, key_cache, value_cache, output,
                     query_start_loc, seq_lens, block_table)
    if query.stride(-1) != 1 or output.stride(-1) != 1 or key_cache.stride(-1) != 1:
        raise ValueError("query, output and the caches need a contiguous last (head_size) dimension")
    if key_cache.stride() != value_cache.stride():
        raise ValueError(f"key_cache strides {key_cache.stride()} differ from value_cache's {value_cache.stride()}")
    if is_fp8(key_cache.dtype):
        check_scale("k_scale", k_scale)
        check_scale("v_scale", v_scale)
    else:
        k_scale = v_scale = 1.0
    # The kernel indexes these small tensors with unit strides (no-ops for the usual contiguous ones).
    query_start_loc, seq_lens, block_table = (t.contiguous() for t in (query_start_loc, seq_lens, block_table))
    num_tokens, num_heads, head_size = query.shape
    num_kv_heads, num_reqs = key_cache.shape[2], seq_lens.shape[0]
    if sinks is not None and (sinks.shape != (num_heads,) or sinks.device != query.device):
        raise ValueError(f"sinks must be one logit per query head, [{num_heads}] on {query.device}, got "
                         f"{tuple(sinks.shape)} on {sinks.device}")
    if num_tokens == 0 or num_reqs == 0:
        return
    group = num_heads // num_kv_heads
    group_padded = next_power_of_2(group)
    # tl.dot needs at least 16 rows; prefill chunks get taller blocks so each K/V tile serves more rows.
    block_m = max(16 if max_query_len <= 1 else 64, group_padded)
    block_q = block_m // group_padded
    head_padded = max(16, next_power_of_2(head_size))
    num_query_blocks = num_tokens // block_q + num_reqs
    splits = num_kv_splits or _default_num_kv_splits(query.device, num_query_blocks * num_kv_heads, max_query_len)

    partial_out = partial_max = partial_sum = output  # placeholders, never touched with one split
    if splits > 1:
        partial_max = torch.empty(num_tokens, num_heads, splits, dtype=torch.float32, device=query.device)
        partial_sum = torch.empty_like(partial_max)
        partial_out = torch.empty(num_tokens, num_heads, splits, head_padded, dtype=torch.float32,
                                  device=query.device)
    # The sinks in the scores' base-2 units, float32; the placeholder is never read without sinks.
    sinks_or_placeholder = output if sinks is None else (sinks.float() * LOG2_E).contiguous()
    span_start, span_end = spans if spans is not None else (seq_lens, seq_lens)  # placeholders, never read
    _paged_attention_kernel[(num_query_blocks, num_kv_heads, splits)](
        output, query, key_cache, value_cache, block_table, seq_lens, query_start_loc,
        partial_out, partial_max, partial_sum, sinks_or_placeholder, span_start, span_end,
        scale * float(k_scale) * LOG2_E, float(v_scale), num_reqs, head_size, sliding_window or 0,
        # The cap in the scores' base-2 units; 1.0 is a placeholder that no uncapped variant reads.
        float(logits_soft_cap) * LOG2_E if logits_soft_cap is not None else 1.0,
        query.stride(0), query.stride(1), output.stride(0), output.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2), block_table.stride(0),
        GROUP=group, GROUP_PADDED=group_padded, BLOCK_Q=block_q, BLOCK_M=block_m, HEAD_PADDED=head_padded,
        BLOCK_SIZE=key_cache.shape[1], TILE=TILE_N, NUM_SPLITS=splits,
        # float32 models get exact dot products; tf32 would cost them about three decimal digits.
        DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        # Triton's interpreter (3.7 to 3.9) multiplies bfloat16 dot operands as raw 16-bit integers; it
        # gets float32 operands instead. Compiled kernels keep the query's dtype.
        DOT_IN_FP32=INTERPRETED and query.dtype == torch.bfloat16,
        HAS_WINDOW=sliding_window is not None,
        HAS_SOFT_CAP=logits_soft_cap is not None,
        HAS_SINKS=sinks is not None,
        HAS_SPANS=spans is not None,
        num_warps=4,
    )
    if splits > 1:
        _combine_splits_kernel[(num_tokens, num_heads)](
            output, partial_out, partial_max, partial_sum, query_start_loc, sinks_or_placeholder,
            num_reqs, head_size, output.stride(0), output.stride(1),
            NUM_SPLITS=splits, SPLITS_PADDED=next_power_of_2(splits), HEAD_PADDED=head_padded,
            HAS_SINKS=sinks is not None,
            num_warps=1 if head_padded <= 64 else 2,
        )


def _default_num_kv_splits(device: torch.device, num_programs: int, max_query_len: int) -> int:
    """Enough splits for about two programs per SM in decode-only steps; one otherwise.

    Depends on shapes only: a CUDA graph captured for a batch size replays with the same split.
    """
    if max_query_len > 1 or device.type != "cuda":
        return 1
    target = 2 * _multiprocessor_count(device.index if device.index is not None else torch.cuda.current_device())
    if num_programs >= target:
        return 1
    return min(MAX_KV_SPLITS, next_power_of_2(math.ceil(target / num_programs)))


@functools.cache
def _multiprocessor_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count
