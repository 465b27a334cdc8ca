"""The Triton paged-attention kernel against the torch reference (on CPU: under TRITON_INTERPRET=1).

Every case draws fresh random inputs through ``kernels.paged_batch``: shuffled block tables, NaN in
every slot no request may read, NaN in the output before the call (rows the kernel must fill show it
if they were skipped; rows it must not touch keep it).
"""

import copy
import math

import pytest
import torch

from kernels import reshape_and_cache
from kernels.fp8 import FP8_DTYPE
from kernels.paged_attention import paged_attention_reference
from kernels.paged_batch import make_paged_batch

pytest.importorskip("triton", reason="triton is not installed (pip install 'servesim[triton]')")
from kernels import triton_paged_attention as triton_module  # noqa: E402  (after the skip)

DEVICE = "cpu" if triton_module.INTERPRETED else "cuda"
# Mixed: a decode, a whole prompt, a chunk with context, a decode at a block boundary, a one-token prompt.
MIXED = [(37, 1), (0, 23), (19, 9), (32, 1), (0, 1)]


def _run(batch, scale, **kwargs):
    """(kernel output, reference output) after the step's tokens were written with the reference."""
    reshape_and_cache(batch.key, batch.value, batch.key_cache, batch.value_cache, batch.slot_mapping,
                      kwargs.get("k_scale", 1.0), kwargs.get("v_scale", 1.0))
    output = torch.full_like(batch.query, float("nan"))
    expected = torch.full_like(batch.query, float("nan"))
    args = (batch.query, batch.key_cache, batch.value_cache)
    tables = (batch.query_start_loc, batch.seq_lens, batch.block_table)
    triton_module.triton_paged_attention(*args, output, *tables, scale, batch.max_query_len, **kwargs)
    paged_attention_reference(*args, expected, *tables, scale,
                              **{k: v for k, v in kwargs.items()
                                 if k in ("k_scale", "v_scale", "sliding_window", "logits_soft_cap")})
    return output.float().cpu(), expected.float().cpu()


def _assert_close(output, expected, num_actual_tokens, atol):
    # Rows of requests are filled and finite; padding rows were not touched (still NaN).
    assert not output[:num_actual_tokens].isnan().any()
    assert output[num_actual_tokens:].isnan().all()
    torch.testing.assert_close(output[:num_actual_tokens], expected[:num_actual_tokens], atol=atol, rtol=0)


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 2), (6, 2), (2, 2)])
def test_mixed_batch_matches_reference(block_size, num_heads, num_kv_heads):
    gen = torch.Generator().manual_seed(block_size * 10 + num_heads)
    batch = make_paged_batch(MIXED, block_size, num_heads, num_kv_heads, 32, device=DEVICE, generator=gen)
    output, expected = _run(batch, 1 / math.sqrt(32))
    _assert_close(output, expected, batch.num_actual_tokens, atol=1e-5)


def test_block_size_smaller_than_a_key_tile():
    # Key tiles (32 positions) span several 4-slot blocks: each position is translated on its own.
    gen = torch.Generator().manual_seed(1)
    batch = make_paged_batch([(13, 1), (5, 7)], 4, 4, 2, 16, device=DEVICE, generator=gen)
    output, expected = _run(batch, 0.25)
    _assert_close(output, expected, batch.num_actual_tokens, atol=1e-5)


def test_padding_rows_and_padded_requests_are_left_alone():
    gen = torch.Generator().manual_seed(2)
    batch = make_paged_batch([(20, 1), (3, 5)], 16, 4, 2, 16, device=DEVICE, generator=gen,
                             num_padded_tokens=3, num_padded_reqs=2)
    output, expected = _run(batch, 0.25)
    _assert_close(output, expected, batch.num_actual_tokens, atol=1e-5)


@pytest.mark.parametrize("num_kv_splits", [2, 3])
def test_split_kv_matches_reference(num_kv_splits):
    # Decodes with long and short contexts: some splits get no keys at all and must be ignored.
    gen = torch.Generator().manual_seed(num_kv_splits)
    batch = make_paged_batch([(70, 1), (2, 1), (33, 1)], 16, 4, 2, 16, device=DEVICE, generator=gen,
                             num_padded_tokens=1, num_padded_reqs=1)
    output, expected = _run(batch, 0.25, num_kv_splits=num_kv_splits)
    _assert_close(output, expected, batch.num_actual_tokens, atol=1e-5)


def test_split_kv_with_prefill_chunks():
    gen = torch.Generator().manual_seed(5)
    batch = make_paged_batch([(40, 6), (0, 3)], 16, 4, 2, 16, device=DEVICE, generator=gen)
    output, expected = _run(batch, 0.25, num_kv_splits=2)
    _assert_close(output, expected, batch.num_actual_tokens, atol=1e-5)


def test_bfloat16_within_bfloat16_tolerance():
    gen = torch.Generator().manual_seed(6)
    batch = make_paged_batch(MIXED[:3], 16, 4, 2, 32, dtype=torch.bfloat16, device=DEVICE, generator=gen)
    output, expected = _run(batch, 1 / math.sqrt(32))
    _assert_close(output, expected, batch.num_actual_tokens, atol=3e-2)


def test_fp8_cache_is_read_with_its_scales():
    gen = torch.Generator().manual_seed(7)
    batch = make_paged_batch(MIXED[:3], 16, 4, 2, 16, dtype=torch.float16, cache_dtype=FP8_DTYPE, device=DEVICE,
                             generator=gen, k_scale=0.02, v_scale=0.05)
    output, expected = _run(batch, 0.25, k_scale=0.02, v_scale=0.05)
    # Same fp8 bytes on both sides: only the fp16 rounding of probabilities and output differs.
    _assert_close(output, expected, batch.num_actual_tokens, atol=1e-2)


def test_head_size_that_is_not_a_power_of_two():
    gen = torch.Generator().manual_seed(8)
    batch = make_paged_batch([(9, 1), (0, 6)], 16, 4, 2, 24, device=DEVICE, generator=gen)
    output, expected = _run(batch, 1 / math.sqrt(24))
    _assert_close(output, expected, batch.num_actual_tokens, atol=1e-5)


def test_mismatched_heads_are_rejected():
    batch = make_paged_batch([(0, 2)], 16, 3, 2, 16, device=DEVICE, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="multiple"):
        triton_module.triton_paged_attention(batch.query, batch.key_cache, batch.value_cache, batch.query.clone(),
                                             batch.query_start_loc, batch.seq_lens, batch.block_table, 1.0, 2)


def test_block_table_with_spare_rows():
    # A persistent block-table buffer has rows for more requests than this step holds.
    gen = torch.Generator().manual_seed(9)
    batch = make_paged_batch([(30, 1), (0, 4)], 16, 4, 2, 16, device=DEVICE, generator=gen)
    spare = torch.full((3, batch.block_table.shape[1]), 10 ** 6, dtype=torch.int32, device=DEVICE)
    batch.block_table = torch.cat([batch.block_table, spare])
    output, expected = _run(batch, 0.25)
    _assert_close(output, expected, batch.num_actual_tokens, atol=1e-5)


# Sliding windows. Decodes (one at a block boundary), a fresh prompt, chunks with context (the long one
# spans two query blocks, so its second block starts at a later tile than its first).
WINDOWED = [(70, 1), (0, 23), (45, 9), (50, 40), (32, 1), (0, 1)]
# Smaller than a block, one block, several blocks, and larger than every sequence (no window at all).
WINDOWS = [1, 5, 16, 35, 1000]


def _dense_windowed_attention(batch, scale, window, logits_soft_cap=None, sinks=None):
    """Independent of both implementations: every request's whole sequence gathered densely (all of it
    still valid here), then in float64 transformers' Gemma 2 order: the soft cap ``C * tanh(s / C)`` on
    the scaled scores, then the mask ``q - window < k <= q`` (``k <= q`` where ``window`` is None); with
    ``sinks``, transformers' gpt-oss softmax: a column of each head's sink logit, dropped after it."""
    block_size = batch.key_cache.shape[1]
    group = batch.query.shape[1] // batch.key_cache.shape[2]
    output = torch.full(batch.query.shape, float("nan"), dtype=torch.float64)
    starts, seq_lens = batch.query_start_loc.tolist(), batch.seq_lens.tolist()
    for req, seq_len in enumerate(seq_lens):
        start, end = starts[req], starts[req + 1]
        key_positions = torch.arange(seq_len)
        blocks = batch.block_table[req].cpu().long()[key_positions // block_size]
        keys = batch.key_cache.cpu()[blocks, key_positions % block_size].double().repeat_interleave(group, 1)
        values = batch.value_cache.cpu()[blocks, key_positions % block_size].double().repeat_interleave(group, 1)
        query_positions = torch.arange(seq_len - (end - start), seq_len)[:, None]
        mask = key_positions[None, :] <= query_positions
        if window is not None:
            mask &= key_positions[None, :] > query_positions - window
        scores = torch.einsum("qhd,khd->hqk", batch.query[start:end].cpu().double(), keys) * scale
        if logits_soft_cap is not None:
            scores = logits_soft_cap * torch.tanh(scores / logits_soft_cap)
        scores = scores.masked_fill(~mask, float("-inf"))
        if sinks is None:
            weights = scores.softmax(-1)
        else:
            sink_column = sinks.cpu().double()[:, None, None].expand(-1, end - start, 1)
            weights = torch.cat((scores, sink_column), dim=-1).softmax(-1)[..., :-1]
        output[start:end] = torch.einsum("hqk,khd->qhd", weights, values)
    return output


def _free_keys_before_windows(batch, window):
    """What the KV-block manager may do to keys that no query of this step can see: hand whole blocks
    back (their table entries now name a block full of NaN) and leave stale data in the partly kept
    first block (NaN here too). Call after the step's keys were written."""
    block_size = batch.key_cache.shape[1]
    nan_block = int(batch.block_table[0, -1])  # the poisoned spare that ends every row of the table
    starts, seq_lens = batch.query_start_loc.tolist(), batch.seq_lens.tolist()
    for req, seq_len in enumerate(seq_lens):
        first_key = max(0, seq_len - (starts[req + 1] - starts[req]) - window + 1)
        positions = torch.arange(first_key, device=batch.key_cache.device)
        blocks = batch.block_table[req].long()[positions // block_size]
        batch.key_cache[blocks, positions % block_size] = float("nan")
        batch.value_cache[blocks, positions % block_size] = float("nan")
        batch.block_table[req, :first_key // block_size] = nan_block


def _windowed_outputs(batch, scale, window, num_kv_splits=None, logits_soft_cap=None, sinks=None):
    """(kernel, reference) outputs, reading a cache whose out-of-window keys are NaN (with a window)."""
    if window is not None:
        _free_keys_before_windows(batch, window)
    args = (batch.query, batch.key_cache, batch.value_cache)
    tables = (batch.query_start_loc, batch.seq_lens, batch.block_table)
    output = torch.full_like(batch.query, float("nan"))
    expected = torch.full_like(batch.query, float("nan"))
    triton_module.triton_paged_attention(*args, output, *tables, scale, batch.max_query_len,
                                         num_kv_splits=num_kv_splits, sliding_window=window,
                                         logits_soft_cap=logits_soft_cap, sinks=sinks)
    paged_attention_reference(*args, expected, *tables, scale, sliding_window=window, logits_soft_cap=logits_soft_cap,
                              sinks=sinks)
    return output.cpu(), expected.cpu()


@pytest.mark.parametrize("block_size", [4, 16])
def test_sliding_window_reference_and_kernel_match_dense_attention(block_size):
    # One batch per block size with the step's keys written once; each window frees keys in a fresh copy.
    gen = torch.Generator().manual_seed(20 + block_size)
    pristine = make_paged_batch(WINDOWED, block_size, 4, 2, 16, device=DEVICE, generator=gen)
    reshape_and_cache(pristine.key, pristine.value, pristine.key_cache, pristine.value_cache,
                      pristine.slot_mapping)
    num_tokens = pristine.num_actual_tokens
    for window in WINDOWS:
        dense = _dense_windowed_attention(pristine, 0.25, window)
        batch = copy.deepcopy(pristine)
        output, expected = _windowed_outputs(batch, 0.25, window)
        # Out-of-window keys are NaN now: neither implementation may have read them.
        _assert_close(expected, dense.float(), num_tokens, atol=1e-5)
        _assert_close(output, expected, num_tokens, atol=1e-5)


def test_window_larger_than_every_sequence_equals_no_window():
    gen = torch.Generator().manual_seed(30)
    batch = make_paged_batch(WINDOWED, 16, 4, 2, 16, device=DEVICE, generator=gen)
    with_window, reference_with_window = _run(batch, 0.25, sliding_window=1000)
    without, reference_without = _run(batch, 0.25)
    assert torch.equal(reference_with_window, reference_without)
    assert torch.equal(with_window, without)


def test_sliding_window_with_split_kv():
    # Three splits over decodes, and over a chunk whose first rows see no key in the later splits (with
    # window 8 its query block has two tiles left, so one split is empty): such partials carry max -inf
    # and must weigh nothing when combined.
    gen = torch.Generator().manual_seed(43)
    batch = make_paged_batch([(70, 1), (2, 1), (40, 30), (33, 1)], 16, 4, 2, 16, device=DEVICE, generator=gen,
                             num_padded_tokens=1, num_padded_reqs=1)
    reshape_and_cache(batch.key, batch.value, batch.key_cache, batch.value_cache, batch.slot_mapping)
    for window in (8, 40):
        output, expected = _windowed_outputs(copy.deepcopy(batch), 0.25, window, num_kv_splits=3)
        _assert_close(output, expected, batch.num_actual_tokens, atol=1e-5)


def test_sliding_window_must_be_positive():
    batch = make_paged_batch([(3, 2)], 16, 4, 2, 16, device=DEVICE, generator=torch.Generator().manual_seed(0))
    args = (batch.query, batch.key_cache, batch.value_cache, batch.query.clone(), batch.query_start_loc,
            batch.seq_lens, batch.block_table, 1.0)
    with pytest.raises(ValueError, match="sliding_window"):
        paged_attention_reference(*args, sliding_window=0)
    with pytest.raises(ValueError, match="sliding_window"):
        triton_module.triton_paged_attention(*args, 2, sliding_window=0)


# Logit soft cap (Gemma 2). Queries are scaled up so that scaled scores reach several times the cap and
# the cap changes the result; float32 scores of magnitude M carry rounding errors of about M * 1e-7,
# which the tolerances follow.


def _large_score_batch(shapes, seed, query_gain):
    """A batch whose step keys are written, with queries ``query_gain`` times larger than usual."""
    batch = make_paged_batch(shapes, 16, 4, 2, 16, device=DEVICE, generator=torch.Generator().manual_seed(seed))
    batch.query *= query_gain
    reshape_and_cache(batch.key, batch.value, batch.key_cache, batch.value_cache, batch.slot_mapping)
    return batch


# A small cap with and without windows, and Gemma 2's own cap (50) once. Scores near 50 carry float32
# errors of ~1e-5 (the kernel's tanh adds about as much), hence that case's looser tolerance.
@pytest.mark.parametrize("cap,query_gain,windows,atol", [(2.0, 8.0, (None, 5, 35), 1e-5), (50.0, 40.0, (None,), 5e-5)],
                         ids=["cap-2-windows", "cap-50"])
def test_soft_cap_reference_and_kernel_match_dense_attention(cap, query_gain, windows, atol):
    # scale 0.25, head_size 16: scaled scores have a standard deviation of about query_gain.
    pristine = _large_score_batch(WINDOWED, 50, query_gain)
    num_tokens = pristine.num_actual_tokens
    for window in windows:
        dense = _dense_windowed_attention(pristine, 0.25, window, logits_soft_cap=cap)
        uncapped = _dense_windowed_attention(pristine, 0.25, window)
        assert (dense - uncapped)[:num_tokens].abs().max() > 0.1  # the cap bites
        output, expected = _windowed_outputs(copy.deepcopy(pristine), 0.25, window, logits_soft_cap=cap)
        _assert_close(expected, dense.float(), num_tokens, atol=atol)
        _assert_close(output, expected, num_tokens, atol=atol)


def test_soft_cap_with_split_kv():
    # As test_sliding_window_with_split_kv: some splits see no key of a row; capping must not change that.
    batch = _large_score_batch([(70, 1), (2, 1), (40, 30), (33, 1)], 51, 8.0)
    for window in (None, 8):
        output, expected = _windowed_outputs(copy.deepcopy(batch), 0.25, window, num_kv_splits=3,
                                             logits_soft_cap=2.0)
        dense = _dense_windowed_attention(batch, 0.25, window, logits_soft_cap=2.0)
        _assert_close(expected, dense.float(), batch.num_actual_tokens, atol=1e-5)
        _assert_close(output, expected, batch.num_actual_tokens, atol=1e-5)


def test_cap_far_above_every_score_changes_almost_nothing():
    # Scores here stay within a few units: a cap of 1e6 moves them by about float32 rounding, in the
    # kernel too (whose tanh keeps a small relative error near 0, where a cap this large puts s / C).
    gen = torch.Generator().manual_seed(52)
    batch = make_paged_batch([(70, 1), (19, 9), (33, 1)], 16, 4, 2, 16, device=DEVICE, generator=gen)
    capped, reference_capped = _run(batch, 0.25, logits_soft_cap=1e6, num_kv_splits=2)
    uncapped, reference_uncapped = _run(batch, 0.25, num_kv_splits=2)
    torch.testing.assert_close(reference_capped, reference_uncapped, atol=1e-6, rtol=0, equal_nan=True)
    torch.testing.assert_close(capped, uncapped, atol=1e-6, rtol=0, equal_nan=True)


@pytest.mark.parametrize("cap", [0, -1.0, True, float("inf"), float("nan"), "50"])
def test_soft_cap_must_be_a_finite_positive_number(cap):
    batch = make_paged_batch([(3, 2)], 16, 4, 2, 16, device=DEVICE, generator=torch.Generator().manual_seed(0))
    args = (batch.query, batch.key_cache, batch.value_cache, batch.query.clone(), batch.query_start_loc,
            batch.seq_lens, batch.block_table, 1.0)
    with pytest.raises(ValueError, match=f"logits_soft_cap .*{cap!r}"):
        paged_attention_reference(*args, logits_soft_cap=cap)
    with pytest.raises(ValueError, match=f"logits_soft_cap .*{cap!r}"):
        triton_module.triton_paged_attention(*args, 2, logits_soft_cap=cap)


# Attention sinks (gpt-oss): one logit per query head joins its softmax and attends nothing. Heads 0..3 get
# sinks from well below to well above their scores, so some heads lose most of their weight to the sink.
SINKS = torch.tensor([-3.0, 0.0, 1.5, 4.0])


@pytest.mark.parametrize("num_kv_splits", [None, 3])
def test_sinks_reference_and_kernel_match_dense_attention(num_kv_splits):
    pristine = make_paged_batch([(70, 1), (0, 23), (19, 9), (2, 1), (33, 1)], 16, 4, 2, 16, device=DEVICE,
                                generator=torch.Generator().manual_seed(60))
    reshape_and_cache(pristine.key, pristine.value, pristine.key_cache, pristine.value_cache, pristine.slot_mapping)
    num_tokens, sinks = pristine.num_actual_tokens, SINKS.to(DEVICE)
    for window in (None, 8):
        dense = _dense_windowed_attention(pristine, 0.25, window, sinks=sinks)
        assert (dense - _dense_windowed_attention(pristine, 0.25, window))[:num_tokens].abs().max() > 0.1  # it bites
        output, expected = _windowed_outputs(copy.deepcopy(pristine), 0.25, window, num_kv_splits=num_kv_splits,
                                             sinks=sinks)
        _assert_close(expected, dense.float(), num_tokens, atol=1e-5)
        _assert_close(output, expected, num_tokens, atol=1e-5)


def test_sinks_must_be_one_per_query_head():
    batch = make_paged_batch([(3, 2)], 16, 4, 2, 16, device=DEVICE, generator=torch.Generator().manual_seed(0))
    args = (batch.query, batch.key_cache, batch.value_cache, batch.query.clone(), batch.query_start_loc,
            batch.seq_lens, batch.block_table, 1.0, 2)
    with pytest.raises(ValueError, match=r"sinks must be one logit per query head, \[4\]"):
        triton_module.triton_paged_attention(*args, sinks=SINKS[:2].to(DEVICE))
