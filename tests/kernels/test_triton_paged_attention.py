"""The Triton paged-attention kernel against the torch reference (on CPU: under TRITON_INTERPRET=1).

Every case draws fresh random inputs through ``kernels.paged_batch``: shuffled block tables, NaN in
every slot no request may read, NaN in the output before the call (rows the kernel must fill show it
if they were skipped; rows it must not touch keep it).
"""

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
                              **{k: v for k, v in kwargs.items() if k in ("k_scale", "v_scale")})
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
