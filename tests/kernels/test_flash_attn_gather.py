"""The flash_attn backend's gather path on CPU, where flash-attn itself cannot run.

``_gather_contiguous`` copies each request's readable keys into varlen runs; flash-attn then applies
``causal=True`` (bottom-right aligned) and ``window_size=(W - 1, 0)`` to them. Here that masking is
written out from flash-attn's documented rule, so the copy and the alignment are checked against the
reference with the keys before every window in freed blocks full of NaN.
"""

import pytest
import torch

from engine.runner.attention import build_attention_metadata
from engine.runner.attention.flash_attn_backend import _gather_contiguous, _window_size
from kernels.paged_attention import paged_attention_reference


def _flash_attn_causal_varlen_rule(query, keys, values, cu_seqlens_q, cu_seqlens_k, scale, window_size):
    """flash-attn's documented semantics with causal=True: query ``i`` of a run of ``q`` queries over ``k``
    keys sees key ``j`` iff ``i + k - q - left <= j <= i + k - q`` (no lower bound where ``left`` is -1)."""
    left, _ = window_size
    output = torch.zeros_like(query)
    group = query.shape[1] // keys.shape[1]
    for q_start, q_end, k_start, k_end in zip(cu_seqlens_q[:-1].tolist(), cu_seqlens_q[1:].tolist(),
                                              cu_seqlens_k[:-1].tolist(), cu_seqlens_k[1:].tolist()):
        num_queries, num_keys = q_end - q_start, k_end - k_start
        diagonal = torch.arange(num_queries)[:, None] + num_keys - num_queries
        key_index = torch.arange(num_keys)[None, :]
        visible = key_index <= diagonal
        if left >= 0:
            visible &= key_index >= diagonal - left
        run_keys = keys[k_start:k_end].repeat_interleave(group, 1)
        run_values = values[k_start:k_end].repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", query[q_start:q_end], run_keys) * scale
        output[q_start:q_end] = torch.einsum("hqk,khd->qhd", scores.masked_fill(~visible, float("-inf")).softmax(-1),
                                             run_values)
    return output


@pytest.mark.parametrize("window", [None, 3, 16, 40])
def test_gathered_runs_give_the_reference(window):
    block_size, num_kv_heads, head_size = 16, 2, 8
    shapes = [(70, 1), (0, 23), (45, 9), (block_size, 1)]
    gen = torch.Generator().manual_seed(window or 0)
    next_block = iter(range(1, 100))
    block_ids = []
    for context_len, query_len in shapes:
        first_key = 0 if window is None else max(0, context_len - window + 1)
        block_ids.append([0 if (index + 1) * block_size <= first_key else next(next_block)
                          for index in range(-(-(context_len + query_len) // block_size))])
    metadata = build_attention_metadata([c for c, _ in shapes], [q for _, q in shapes], block_ids, block_size)
    key_cache = torch.randn(next(next_block), block_size, num_kv_heads, head_size, generator=gen)
    value_cache = torch.randn(key_cache.shape, generator=gen)
    key_cache[0] = float("nan")  # the null block that freed table entries name
    value_cache[0] = float("nan")
    query = torch.randn(metadata.num_actual_tokens, 4, head_size, generator=gen)

    keys, values, cu_seqlens_k, max_seqlen_k = _gather_contiguous(key_cache, value_cache, metadata, window)
    assert not keys.isnan().any() and not values.isnan().any()
    assert max_seqlen_k == max(end - start for start, end in zip(cu_seqlens_k[:-1].tolist(), cu_seqlens_k[1:].tolist()))
    output = _flash_attn_causal_varlen_rule(query, keys, values, metadata.query_start_loc, cu_seqlens_k, 0.25,
                                            _window_size(window))
    expected = torch.zeros_like(query)
    paged_attention_reference(query, key_cache, value_cache, expected, metadata.query_start_loc, metadata.seq_lens,
                              metadata.block_table, 0.25, sliding_window=window)
    torch.testing.assert_close(output, expected, atol=1e-5, rtol=1e-5)
