"""The 'triton' attention backend: registered beside 'torch' and 'flash_attn', same results as 'torch'.

Runs the full backend path (cache write, then attention) from runner-built metadata; on CPU through
Triton's interpreter (TRITON_INTERPRET=1, set in this directory's conftest).
"""

import importlib.util
import math
import random

import pytest
import torch

from engine.runner.attention import (allocate_kv_caches, available_attention_backends, build_attention_metadata,
                                     get_attention_backend)
from kernels.triton_support import interpreter_enabled


def test_registered_beside_the_others():
    assert available_attention_backends() == ["flash_attn", "torch", "triton"]


def test_clear_error_when_triton_cannot_run(monkeypatch):
    import engine.runner.attention.triton_backend as triton_backend

    monkeypatch.setattr(triton_backend, "triton_unavailable_reason", lambda: "the triton package is not installed")
    with pytest.raises(RuntimeError, match="attention backend 'triton' cannot run here: the triton package"):
        get_attention_backend("triton")


requires_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                     reason="triton is not installed (pip install 'servesim[triton]')")
# Where the kernels run: on CPU tensors under the interpreter (the conftest turns it on without a GPU).
DEVICE = "cpu" if interpreter_enabled() else "cuda"


def _compare_with_torch_backend(shapes, block_size, num_heads, num_kv_heads, head_size=16, seed=0,
                                shared_prefix_blocks=0, num_padded_tokens=None, dtype=torch.float32, atol=1e-5):
    """Both backends from identical caches; request 1 may share request 0's first blocks (written now)."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-(c + q) // block_size) for c, q in shapes) + 4
    free = list(range(num_blocks))
    rng.shuffle(free)
    block_ids = [[free.pop() for _ in range(-(-(c + q) // block_size))] for c, q in shapes]
    if shared_prefix_blocks:
        block_ids[1][:shared_prefix_blocks] = block_ids[0][:shared_prefix_blocks]
    metadata = build_attention_metadata([c for c, _ in shapes], [q for _, q in shapes], block_ids, block_size,
                                        device=DEVICE, num_padded_tokens=num_padded_tokens)
    ((key_cache, value_cache),) = allocate_kv_caches(1, num_blocks, block_size, num_kv_heads, head_size, dtype,
                                                     DEVICE)
    key_cache.copy_(torch.randn(key_cache.shape, generator=gen))  # contexts: whatever the cache holds
    value_cache.copy_(torch.randn(value_cache.shape, generator=gen))
    num_tokens = num_padded_tokens or metadata.num_actual_tokens
    query, key, value = (torch.randn(num_tokens, heads, head_size, generator=gen).to(device=DEVICE, dtype=dtype)
                         for heads in (num_heads, num_kv_heads, num_kv_heads))
    scale = 1 / math.sqrt(head_size)

    caches = (key_cache.clone(), value_cache.clone())
    expected = get_attention_backend("torch").forward(query, key, value, caches, metadata, scale)
    output = get_attention_backend("triton").forward(query, key, value, (key_cache, value_cache), metadata, scale)

    assert torch.equal(key_cache.cpu(), caches[0].cpu()) and torch.equal(value_cache.cpu(), caches[1].cpu())
    torch.testing.assert_close(output.float().cpu(), expected.float().cpu(), atol=atol, rtol=atol)
    assert output[metadata.num_actual_tokens:].eq(0).all()


@requires_triton
@pytest.mark.parametrize("block_size", [16, 32])
def test_mixed_batch_matches_torch_backend(block_size):
    _compare_with_torch_backend([(37, 1), (0, 23), (33, 9), (block_size, 1), (0, 1)], block_size, 4, 2,
                                seed=block_size)


@requires_triton
def test_shared_prefix_written_in_the_same_step():
    # Request 1 reads a block that request 0 writes in this very step: the write must come first.
    _compare_with_torch_backend([(0, 20), (16, 3)], 16, 4, 2, seed=3, shared_prefix_blocks=1)


@requires_triton
def test_padded_tokens_produce_zeros():
    _compare_with_torch_backend([(9, 1), (0, 6)], 16, 4, 2, seed=4, num_padded_tokens=12)


@requires_triton
def test_bfloat16_decodes():
    _compare_with_torch_backend([(20, 1), (45, 1)], 16, 8, 2, seed=5, dtype=torch.bfloat16, atol=3e-2)
