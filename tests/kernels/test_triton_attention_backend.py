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
from kernels.paged_attention import paged_attention_reference
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
                                shared_prefix_blocks=0, num_padded_tokens=None, dtype=torch.float32, atol=1e-5,
                                sinks=None):
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
    expected = get_attention_backend("torch").forward(query, key, value, caches, metadata, scale, sinks=sinks)
    output = get_attention_backend("triton").forward(query, key, value, (key_cache, value_cache), metadata, scale,
                                                     sinks=sinks)

    assert torch.equal(key_cache.cpu(), caches[0].cpu()) and torch.equal(value_cache.cpu(), caches[1].cpu())
    torch.testing.assert_close(output.float().cpu(), expected.float().cpu(), atol=atol, rtol=atol)
    assert output[metadata.num_actual_tokens:].eq(0).all()


@requires_triton
@pytest.mark.parametrize("block_size", [16, 32])
def test_mixed_batch_matches_torch_backend(block_size):
    _compare_with_torch_backend([(37, 1), (0, 23), (33, 9), (block_size, 1), (0, 1)], block_size, 4, 2,
                                seed=block_size)


@requires_triton
def test_sinks_match_the_torch_backend():
    # gpt-oss's sinks through both backends: the torch backend's decode, fresh-prompt and masked-chunk paths (a
    # prompt past 128 rows is sliced) against the kernel; sinks from well below to well above the scores.
    sinks = torch.tensor([-3.0, 0.0, 1.5, 4.0], device=DEVICE)
    _compare_with_torch_backend([(37, 1), (0, 23), (33, 9), (0, 140), (0, 1)], 16, 4, 2, seed=7, sinks=sinks)


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


@requires_triton
@pytest.mark.parametrize("window", [5, 16, 40])
def test_sliding_window_reads_no_freed_block(window):
    # Blocks wholly before each request's window were handed back: their table entries name the null
    # block 0, full of NaN here. The backend must match the reference and stay finite.
    block_size, num_kv_heads, head_size = 16, 2, 16
    shapes = [(70, 1), (0, 23), (45, 9), (block_size, 1)]
    gen = torch.Generator().manual_seed(window)
    next_block = iter(range(1, 100))
    block_ids = []
    for context_len, query_len in shapes:
        first_key = max(0, context_len - window + 1)
        block_ids.append([0 if (index + 1) * block_size <= first_key else next(next_block)
                          for index in range(-(-(context_len + query_len) // block_size))])
    num_tokens = sum(q for _, q in shapes) + 2  # two padding rows, which must come out as zeros
    metadata = build_attention_metadata([c for c, _ in shapes], [q for _, q in shapes], block_ids, block_size,
                                        device=DEVICE, num_padded_tokens=num_tokens)
    num_blocks = next(next_block)
    ((key_cache, value_cache),) = allocate_kv_caches(1, num_blocks, block_size, num_kv_heads, head_size,
                                                     torch.float32, DEVICE)
    key_cache.copy_(torch.randn(key_cache.shape, generator=gen))
    value_cache.copy_(torch.randn(value_cache.shape, generator=gen))
    key_cache[0] = float("nan")
    value_cache[0] = float("nan")
    query, key, value = (torch.randn(num_tokens, heads, head_size, generator=gen).to(DEVICE)
                         for heads in (4, num_kv_heads, num_kv_heads))

    # What forward does (write, then attend into zeros), called in steps to hand attend the window.
    backend = get_attention_backend("triton")
    backend.write_kv_cache(key, value, key_cache, value_cache, metadata)
    output = torch.zeros_like(query)
    backend.attend(query, key_cache, value_cache, metadata, 0.25, output, sliding_window=window)
    expected = torch.zeros_like(query)
    paged_attention_reference(query, key_cache, value_cache, expected, metadata.query_start_loc, metadata.seq_lens,
                              metadata.block_table, 0.25, sliding_window=window)
    assert output.isfinite().all() and output[metadata.num_actual_tokens:].eq(0).all()
    torch.testing.assert_close(output.cpu(), expected.cpu(), atol=1e-5, rtol=1e-5)


@requires_triton
def test_soft_cap_is_passed_to_the_kernel():
    # Queries scaled up so that scores reach several times the cap: capping changes the result.
    block_size, num_kv_heads, head_size = 16, 2, 16
    shapes = [(37, 1), (0, 9)]
    gen = torch.Generator().manual_seed(60)
    metadata = build_attention_metadata([c for c, _ in shapes], [q for _, q in shapes], [[0, 1, 2], [3]], block_size,
                                        device=DEVICE)
    ((key_cache, value_cache),) = allocate_kv_caches(1, 4, block_size, num_kv_heads, head_size, torch.float32, DEVICE)
    key_cache.copy_(torch.randn(key_cache.shape, generator=gen))
    value_cache.copy_(torch.randn(value_cache.shape, generator=gen))
    query = (8 * torch.randn(metadata.num_actual_tokens, 4, head_size, generator=gen)).to(DEVICE)
    tables = (metadata.query_start_loc, metadata.seq_lens, metadata.block_table)

    output = torch.zeros_like(query)
    get_attention_backend("triton").attend(query, key_cache, value_cache, metadata, 0.25, output, logits_soft_cap=2.0)
    expected, uncapped = torch.zeros_like(query), torch.zeros_like(query)
    paged_attention_reference(query, key_cache, value_cache, expected, *tables, 0.25, logits_soft_cap=2.0)
    paged_attention_reference(query, key_cache, value_cache, uncapped, *tables, 0.25)
    assert (expected - uncapped).abs().max() > 0.1
    torch.testing.assert_close(output.cpu(), expected.cpu(), atol=1e-5, rtol=1e-5)
