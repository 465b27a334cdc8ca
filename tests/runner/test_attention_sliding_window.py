"""Sliding-window attention in the torch backend, against dense windowed attention computed directly.

A query at position ``p`` sees keys ``max(0, p - window + 1) .. p``. The blocks that lie wholly before the
first query's window are pointed at one "null" block full of NaN, as the core leaves them once it has
freed them: any read of such a block that reaches the output shows up as NaN.
"""

import math

import pytest
import torch

from engine.runner.attention import allocate_kv_caches, build_attention_metadata, get_attention_backend
from kernels import reshape_and_cache

NULL_BLOCK = 0


def dense_windowed_attention(q, k, v, context_len, scale, window, cap=None):
    """q [n, Hq, D], k/v [ctx + n, Hkv, D] -> [n, Hq, D] in float64; query j sees keys in its window; with a
    ``cap``, each score is capped at ``cap * tanh(s / cap)`` before the mask (Gemma 2)."""
    group = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(group, dim=1)
    v = v.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    if cap is not None:
        scores = cap * torch.tanh(scores / cap)
    key_positions = torch.arange(k.shape[0])[None, :]
    query_positions = (context_len + torch.arange(q.shape[0]))[:, None]
    visible = key_positions <= query_positions
    if window is not None:
        visible &= key_positions > query_positions - window
    return torch.einsum("hqk,khd->qhd", scores.masked_fill(~visible, float("-inf")).softmax(-1), v)


def run_windowed_case(shapes, window, block_size=16, num_heads=4, num_kv_heads=2, head_size=8, seed=0,
                      free_out_of_window=True, cap=None, query_scale=1.0):
    """Attend a batch of (context_len, query_len) requests through the backend; compare each request."""
    torch.manual_seed(seed)
    num_blocks = 1 + sum(-(-(c + q) // block_size) for c, q in shapes)
    ((key_cache, value_cache),) = allocate_kv_caches(1, num_blocks, block_size, num_kv_heads, head_size,
                                                     torch.float32, "cpu")
    key_cache.fill_(float("nan"))
    value_cache.fill_(float("nan"))
    next_block, block_ids, keys, values, queries = 1, [], [], [], []
    for context_len, query_len in shapes:
        seq_len = context_len + query_len
        first_visible = 0 if window is None else max(0, context_len - window + 1)
        ids = []
        for block in range(-(-seq_len // block_size)):
            if free_out_of_window and (block + 1) * block_size <= first_visible:
                ids.append(NULL_BLOCK)  # freed: never written for this request, never to be read
            else:
                ids.append(next_block)
                next_block += 1
        block_ids.append(ids)
        keys.append(torch.randn(seq_len, num_kv_heads, head_size))
        values.append(torch.randn(seq_len, num_kv_heads, head_size))
        queries.append(torch.randn(query_len, num_heads, head_size) * query_scale)
        written = torch.arange(first_visible // block_size * block_size, context_len)
        slots = torch.tensor(ids)[written // block_size] * block_size + written % block_size
        reshape_and_cache(keys[-1][written], values[-1][written], key_cache, value_cache, slots)

    metadata = build_attention_metadata([c for c, _ in shapes], [q for _, q in shapes], block_ids, block_size)
    key = torch.cat([k[c:] for k, (c, _) in zip(keys, shapes)])
    value = torch.cat([v[c:] for v, (c, _) in zip(values, shapes)])
    scale = 1 / math.sqrt(head_size)
    output = get_attention_backend("torch").forward(torch.cat(queries), key, value, (key_cache, value_cache),
                                                    metadata, scale, sliding_window=window, logits_soft_cap=cap)
    for i, (context_len, query_len) in enumerate(shapes):
        start = metadata.query_start_loc_cpu[i]
        expected = dense_windowed_attention(queries[i], keys[i], values[i], context_len, scale, window, cap)
        torch.testing.assert_close(output[start:start + query_len].double(), expected, atol=1e-5, rtol=1e-5,
                                   msg=f"request {i} (context {context_len}, query {query_len}, window {window})")
    return output


# Decodes of many lengths, a fresh prompt longer than a 128-row query slice, chunks after a context, a
# chunk whose first query's window starts mid-block, and a request shorter than the window.
MIXED = [(37, 1), (0, 150), (50, 1), (33, 9), (0, 1), (5, 1), (200, 140), (64, 17), (16, 1), (95, 1), (300, 1)]


@pytest.mark.parametrize("window", [1, 7, 16, 40, 129, 4096])
def test_mixed_batch_with_a_window(window):
    run_windowed_case(MIXED, window)


def test_window_longer_than_every_sequence_is_full_attention():
    full = run_windowed_case(MIXED, None, seed=3)
    windowed = run_windowed_case(MIXED, 10_000, seed=3)
    torch.testing.assert_close(windowed, full, atol=0, rtol=0)


def test_a_window_with_every_block_kept_reads_only_the_window():
    # Without freed blocks the same keys are there, and the window must still hide the early ones.
    run_windowed_case(MIXED, 24, free_out_of_window=False, seed=5)


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (8, 2), (4, 1)])
def test_grouped_query_heads_with_a_window(num_heads, num_kv_heads):
    run_windowed_case([(70, 1), (0, 40), (90, 33)], 20, num_heads=num_heads, num_kv_heads=num_kv_heads, seed=7)


@pytest.mark.parametrize("window", [None, 7, 40])
def test_capped_scores_with_and_without_a_window(window):
    # Queries scaled up so that scores reach several times the cap: the cap changes the result.
    capped = run_windowed_case(MIXED, window, cap=2.0, query_scale=6.0, seed=11)
    uncapped = run_windowed_case(MIXED, window, query_scale=6.0, seed=11)
    assert (capped - uncapped).abs().max() > 0.1


def test_a_cap_far_above_every_score_is_no_cap():
    capped = run_windowed_case(MIXED, 24, cap=1e6, seed=13)
    torch.testing.assert_close(capped, run_windowed_case(MIXED, 24, seed=13), atol=1e-5, rtol=1e-5)
