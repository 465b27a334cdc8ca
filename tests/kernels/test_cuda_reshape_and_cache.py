"""The CUDA reshape_and_cache: a clear error naming what is missing here; on a GPU, the reference's bytes."""

import pytest
import torch

from kernels import reshape_and_cache
from kernels.cuda_reshape_and_cache import (CudaKernelUnavailableError, cuda_reshape_and_cache, load_extension,
                                            missing_requirements)
from kernels.fp8 import FP8_DTYPE

CAN_BUILD = not missing_requirements()
needs_cuda_build = pytest.mark.skipif(not CAN_BUILD, reason="needs " + "; ".join(missing_requirements()))


@pytest.mark.skipif(CAN_BUILD, reason="the kernel can be built here")
def test_error_names_what_is_missing():
    load_extension.cache_clear()
    with pytest.raises(CudaKernelUnavailableError, match="missing: ") as caught:
        cuda_reshape_and_cache(torch.zeros(1, 1, 8), torch.zeros(1, 1, 8), torch.zeros(1, 4, 1, 8),
                               torch.zeros(1, 4, 1, 8), torch.tensor([0]))
    for requirement in missing_requirements():
        assert requirement in str(caught.value)


def test_missing_requirements_are_words_about_this_machine():
    for requirement in missing_requirements():
        assert any(word in requirement for word in ("CUDA", "nvcc", "C++ compiler", "ninja"))


def _inputs(seed, num_tokens, block_size, heads, head_size, dtype, cache_dtype, num_blocks=6):
    gen = torch.Generator().manual_seed(seed)
    key = (torch.randn(num_tokens, heads, head_size, generator=gen) * 3).to(dtype)
    value = torch.randn(num_tokens, heads, head_size, generator=gen).to(dtype)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[::5] = -1
    shape = (num_blocks, block_size, heads, head_size)
    caches = [torch.full(shape, float("nan")).to(cache_dtype) for _ in range(2)]
    return [t.cuda() for t in (key, value, *caches, slots)]


def _check(key, value, key_cache, value_cache, slots, **scales):
    expected_key, expected_value = key_cache.clone(), value_cache.clone()
    reshape_and_cache(key, value, expected_key, expected_value, slots, **scales)
    cuda_reshape_and_cache(key, value, key_cache, value_cache, slots, **scales)
    assert torch.equal(key_cache.view(torch.uint8), expected_key.view(torch.uint8))
    assert torch.equal(value_cache.view(torch.uint8), expected_value.view(torch.uint8))


@needs_cuda_build
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_matches_reference_vectorized_path(block_size, dtype):
    _check(*_inputs(block_size, 40, block_size, 4, 64, dtype, dtype))


@needs_cuda_build
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fp8_matches_reference_bytes(dtype):
    _check(*_inputs(3, 40, 16, 2, 64, dtype, FP8_DTYPE), k_scale=0.037, v_scale=0.5)


@needs_cuda_build
def test_strided_key_and_int32_slots_take_the_elementwise_path():
    key, value, key_cache, value_cache, slots = _inputs(4, 30, 16, 2, 24, torch.bfloat16, torch.bfloat16)
    qkv = torch.cat([torch.randn(30, 4, 24, device="cuda", dtype=torch.bfloat16), key, value], dim=1)
    _check(qkv[:, 4:6], qkv[:, 6:8], key_cache, value_cache, slots.to(torch.int32))


@needs_cuda_build
def test_cast_to_another_non_fp8_dtype_is_refused():
    key, value, key_cache, value_cache, slots = _inputs(5, 4, 16, 2, 16, torch.float32, torch.bfloat16)
    with pytest.raises(RuntimeError, match="float8_e4m3fn"):
        cuda_reshape_and_cache(key, value, key_cache, value_cache, slots)
