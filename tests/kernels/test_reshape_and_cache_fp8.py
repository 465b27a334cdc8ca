"""The fp8 option of the torch reference: stored = value / scale, saturated, round-to-nearest-even."""

import pytest
import torch

from kernels import reshape_and_cache
from kernels.fp8 import FP8_DTYPE, FP8_MAX, dequantize_fp8, quantize_fp8

# e4m3 keeps 3 mantissa bits: rounding to nearest is off by at most half a step, 2**-4 relative, and
# by at most half the subnormal spacing (2**-10) near zero.
FP8_RTOL, FP8_ATOL = 2.0 ** -4, 2.0 ** -10


def _caches(num_blocks, block_size, heads, head_size, dtype):
    shape = (num_blocks, block_size, heads, head_size)
    return torch.full(shape, float("nan")).to(dtype), torch.full(shape, float("nan")).to(dtype)


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_fp8_round_trip_within_fp8_tolerance(block_size, dtype):
    gen = torch.Generator().manual_seed(block_size)
    num_tokens, heads, head_size, k_scale, v_scale = 21, 2, 16, 0.05, 0.3
    key = (torch.randn(num_tokens, heads, head_size, generator=gen) * 4).to(dtype)
    value = torch.randn(num_tokens, heads, head_size, generator=gen).to(dtype)
    slots = torch.randperm(4 * block_size, generator=gen)[:num_tokens]
    slots[3] = -1
    key_cache, value_cache = _caches(4, block_size, heads, head_size, FP8_DTYPE)

    reshape_and_cache(key, value, key_cache, value_cache, slots, k_scale=k_scale, v_scale=v_scale)

    valid = slots >= 0
    flat_keys = key_cache.view(-1, heads, head_size)[slots[valid]]
    flat_values = value_cache.view(-1, heads, head_size)[slots[valid]]
    torch.testing.assert_close(dequantize_fp8(flat_keys, k_scale), key[valid].float(),
                               rtol=FP8_RTOL, atol=FP8_ATOL * k_scale)
    torch.testing.assert_close(dequantize_fp8(flat_values, v_scale), value[valid].float(),
                               rtol=FP8_RTOL, atol=FP8_ATOL * v_scale)
    # Only the valid tokens' slots were written; every other slot still holds the NaN poison.
    written = ~key_cache.float().isnan().all(-1).all(-1)
    assert int(written.sum()) == int(valid.sum())


def test_fp8_saturates_instead_of_overflowing_to_nan():
    stored = quantize_fp8(torch.tensor([1e6, -1e6, 460.0, 448.0, 0.0]), 1.0)
    assert stored.float().tolist() == [FP8_MAX, -FP8_MAX, FP8_MAX, FP8_MAX, 0.0]


def test_fp8_rounds_to_nearest_even_like_torch():
    values = torch.randn(4096, generator=torch.Generator().manual_seed(1)) * 30
    assert torch.equal(quantize_fp8(values, 0.5).view(torch.uint8), (values / 0.5).to(FP8_DTYPE).view(torch.uint8))


def test_scales_are_ignored_for_non_fp8_caches():
    key = torch.randn(3, 1, 8)
    key_cache, value_cache = _caches(1, 4, 1, 8, torch.float32)
    reshape_and_cache(key, key, key_cache, value_cache, torch.tensor([0, 1, 2]), k_scale=7.0, v_scale=0.1)
    assert torch.equal(key_cache[0, :3], key) and torch.equal(value_cache[0, :3], key)


@pytest.mark.parametrize("scale", [0.0, -1.0])
def test_non_positive_scale_is_rejected_for_fp8(scale):
    key_cache, value_cache = _caches(1, 4, 1, 8, FP8_DTYPE)
    with pytest.raises(ValueError, match="k_scale"):
        reshape_and_cache(torch.ones(1, 1, 8), torch.ones(1, 1, 8), key_cache, value_cache, torch.tensor([0]),
                          k_scale=scale)


def test_other_fp8_formats_are_refused_by_name():
    cache = torch.zeros(1, 4, 1, 8, dtype=torch.float8_e5m2)
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        reshape_and_cache(torch.ones(1, 1, 8), torch.ones(1, 1, 8), cache, cache.clone(), torch.tensor([0]))
