"""The Triton reshape_and_cache writes exactly the reference's bytes (on CPU: under TRITON_INTERPRET=1)."""

import pytest
import torch

from kernels import reshape_and_cache
from kernels.fp8 import FP8_DTYPE

pytest.importorskip("triton", reason="triton is not installed (pip install 'servesim[triton]')")
from kernels import triton_reshape_and_cache as triton_module  # noqa: E402  (after the skip)

DEVICE = "cpu" if triton_module.INTERPRETED else "cuda"


def _inputs(seed, num_tokens, num_blocks, block_size, heads, head_size, dtype, cache_dtype):
    gen = torch.Generator().manual_seed(seed)
    key = (torch.randn(num_tokens, heads, head_size, generator=gen) * 3).to(dtype)
    value = torch.randn(num_tokens, heads, head_size, generator=gen).to(dtype)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[torch.randperm(num_tokens, generator=gen)[: num_tokens // 4]] = -1  # padding tokens anywhere
    shape = (num_blocks, block_size, heads, head_size)
    # NaN poison: a slot the kernel should not touch keeps it, a slot it forgot to write shows it.
    key_cache = torch.full(shape, float("nan")).to(cache_dtype)
    value_cache = torch.full(shape, float("nan")).to(cache_dtype)
    return [t.to(DEVICE) for t in (key, value, key_cache, value_cache, slots)]


def _assert_same_bytes(actual, expected):
    assert torch.equal(actual.cpu().view(torch.uint8), expected.cpu().view(torch.uint8))


def _check_against_reference(key, value, key_cache, value_cache, slots, **scales):
    expected_key, expected_value = key_cache.clone(), value_cache.clone()
    reshape_and_cache(key, value, expected_key, expected_value, slots, **scales)
    triton_module.triton_reshape_and_cache(key, value, key_cache, value_cache, slots, **scales)
    _assert_same_bytes(key_cache, expected_key)
    _assert_same_bytes(value_cache, expected_value)


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_reference(block_size, dtype):
    _check_against_reference(*_inputs(block_size, 19, 5, block_size, 2, 16, dtype, dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fp8_cache_matches_reference_bytes(dtype):
    inputs = _inputs(7, 23, 3, 16, 2, 32, dtype, FP8_DTYPE)
    _check_against_reference(*inputs, k_scale=0.037, v_scale=0.5)


def test_fp8_edge_values_round_and_saturate_like_the_reference():
    # Carries into the exponent (1.96 -> 2.0), ties, subnormals, signed zeros and out-of-range values.
    edge = torch.tensor([1.96, -1.96, 0.1245, 2.0 ** -9, 3 * 2.0 ** -11, -1e-6, -0.0, 0.0, 447.0, 470.0,
                         -1e5, 17.0, 19.0, 2.0 ** -7 * 1.0625, 1.0, 240.0])
    key = edge.view(1, 1, 16).to(DEVICE)
    cache = torch.full((1, 16, 1, 16), float("nan")).to(FP8_DTYPE).to(DEVICE)
    _check_against_reference(key, -key, cache, cache.clone(), torch.tensor([5], device=DEVICE))


def test_strided_key_value_from_a_fused_projection():
    # key/value as views into one [tokens, (Hq + 2 * Hkv) * D] projection output, as a model produces them.
    gen = torch.Generator().manual_seed(3)
    num_tokens, heads, head_size = 9, 2, 16
    qkv = torch.randn(num_tokens, (4 + 2 * heads) * head_size, generator=gen).to(DEVICE)
    key = qkv[:, 4 * head_size:(4 + heads) * head_size].view(num_tokens, heads, head_size)
    value = qkv[:, (4 + heads) * head_size:].view(num_tokens, heads, head_size)
    assert not key.is_contiguous()
    *_, key_cache, value_cache, slots = _inputs(3, num_tokens, 2, 16, heads, head_size, torch.float32, torch.float32)
    _check_against_reference(key, value, key_cache, value_cache, slots)


def test_int32_slot_mapping_and_extra_key_rows():
    key, value, key_cache, value_cache, slots = _inputs(4, 12, 2, 16, 2, 16, torch.float32, torch.float32)
    # Rows of key/value past slot_mapping (a padded batch with a shorter slot_mapping) are ignored.
    _check_against_reference(key, value, key_cache, value_cache, slots[:8].to(torch.int32))


def test_empty_slot_mapping_writes_nothing():
    key, value, key_cache, value_cache, slots = _inputs(5, 4, 2, 16, 2, 16, torch.float32, torch.float32)
    before = key_cache.clone()
    triton_module.triton_reshape_and_cache(key, value, key_cache, value_cache, slots[:0])
    _assert_same_bytes(key_cache, before)


def test_shape_errors_match_the_reference():
    key, value, key_cache, value_cache, slots = _inputs(6, 4, 2, 16, 2, 16, torch.float32, torch.float32)
    with pytest.raises(ValueError, match="per-token shape"):
        triton_module.triton_reshape_and_cache(key[:, :1], value[:, :1], key_cache, value_cache, slots)


@pytest.mark.skipif(triton_module.INTERPRETED, reason="the interpreter runs on CPU tensors by design")
def test_compiled_kernel_refuses_cpu_tensors_clearly():
    from kernels.triton_support import TritonUnavailableError

    key = torch.zeros(1, 1, 16)
    cache = torch.zeros(1, 16, 1, 16)
    with pytest.raises(TritonUnavailableError, match="cpu"):
        triton_module.triton_reshape_and_cache(key, key, cache, cache.clone(), torch.tensor([0]))
