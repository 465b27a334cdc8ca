"""reshape_and_cache writes each token to exactly its slot and nowhere else; -1 slots are skipped."""

import pytest
import torch

from kernels import reshape_and_cache


def _reference(key, value, key_cache, value_cache, slot_mapping):
    block_size = key_cache.shape[1]
    for token, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:
            continue
        key_cache[slot // block_size, slot % block_size] = key[token]
        value_cache[slot // block_size, slot % block_size] = value[token]


@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_loop_reference(block_size, dtype):
    gen = torch.Generator().manual_seed(block_size)
    num_blocks, heads, head_size, num_tokens = 7, 2, 8, 13
    key = torch.randn(num_tokens, heads, head_size, generator=gen).to(dtype)
    value = torch.randn(num_tokens, heads, head_size, generator=gen).to(dtype)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[::4] = -1  # padding tokens
    cache_shape = (num_blocks, block_size, heads, head_size)
    key_cache = torch.full(cache_shape, float("nan"), dtype=dtype)
    value_cache = torch.full(cache_shape, float("nan"), dtype=dtype)
    expected_key, expected_value = key_cache.clone(), value_cache.clone()

    reshape_and_cache(key, value, key_cache, value_cache, slots)
    _reference(key, value, expected_key, expected_value, slots)

    torch.testing.assert_close(key_cache, expected_key, equal_nan=True, rtol=0, atol=0)
    torch.testing.assert_close(value_cache, expected_value, equal_nan=True, rtol=0, atol=0)
    # Exactly the non-padding tokens were written, nothing else.
    assert int((~key_cache.isnan()).all(-1).all(-1).sum()) == int((slots >= 0).sum())


def test_slot_is_block_times_block_size_plus_offset():
    key_cache = torch.zeros(4, 16, 1, 2)
    value_cache = torch.zeros(4, 16, 1, 2)
    key = torch.ones(1, 1, 2) * 3
    reshape_and_cache(key, key * 2, key_cache, value_cache, torch.tensor([2 * 16 + 5]))
    assert key_cache[2, 5].eq(3).all() and value_cache[2, 5].eq(6).all()
    assert key_cache.count_nonzero() == 2


def test_padded_key_rows_beyond_slot_mapping_are_ignored():
    key_cache = torch.zeros(2, 4, 1, 2)
    value_cache = torch.zeros(2, 4, 1, 2)
    key = torch.arange(10, dtype=torch.float32).view(5, 1, 2)
    reshape_and_cache(key, key, key_cache, value_cache, torch.tensor([7, -1, 0]))
    assert key_cache[1, 3].tolist() == [[0.0, 1.0]]
    assert key_cache[0, 0].tolist() == [[4.0, 5.0]]
    assert key_cache.count_nonzero() == 3  # the value 0.0 written at slot 7 is a zero


def test_non_contiguous_cache_is_rejected():
    key_cache = torch.zeros(4, 2, 2, 8).transpose(0, 1)  # blocks not outermost: a write would land in a copy
    key = torch.zeros(1, 2, 8)
    with pytest.raises(RuntimeError):
        reshape_and_cache(key, key, key_cache, key_cache, torch.tensor([0]))


def test_shape_mismatch_is_rejected():
    cache = torch.zeros(2, 4, 2, 8)
    with pytest.raises(ValueError, match="per-token shape"):
        reshape_and_cache(torch.zeros(1, 3, 8), torch.zeros(1, 3, 8), cache, cache.clone(), torch.tensor([0]))
