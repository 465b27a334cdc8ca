"""The torch paged-attention backend against dense per-request causal attention computed directly."""

import math
import random

import pytest
import torch

from engine.runner.attention import (AttentionBackend, allocate_kv_caches, build_attention_metadata,
                                     compute_positions, get_attention_backend)
from kernels import reshape_and_cache


def dense_attention(q, k, v, context_len, scale):
    """q [n, Hq, D], k/v [ctx + n, Hkv, D] -> [n, Hq, D], in float64, query j seeing keys 0..ctx+j."""
    group = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(group, dim=1)
    v = v.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    n, total = q.shape[0], k.shape[0]
    allowed = torch.arange(total)[None, :] <= (context_len + torch.arange(n))[:, None]
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def make_batch(rng, shapes, block_size, num_kv_heads, head_size, num_blocks, shared_prefix=None):
    """Random K/V per request, shuffled distinct physical blocks; context K/V pre-written to the cache."""
    free_blocks = list(range(num_blocks))
    rng.shuffle(free_blocks)
    block_ids, keys, values = [], [], []
    for context_len, query_len in shapes:
        seq_len = context_len + query_len
        block_ids.append([free_blocks.pop() for _ in range(-(-seq_len // block_size))])
        keys.append(torch.randn(seq_len, num_kv_heads, head_size))
        values.append(torch.randn(seq_len, num_kv_heads, head_size))
    if shared_prefix is not None:
        # Request `reader` reuses the first blocks of request `writer`, which writes them in this step.
        writer, reader, num_shared_blocks = shared_prefix
        block_ids[reader][:num_shared_blocks] = block_ids[writer][:num_shared_blocks]
        shared_tokens = num_shared_blocks * block_size
        keys[reader][:shared_tokens] = keys[writer][:shared_tokens]
        values[reader][:shared_tokens] = values[writer][:shared_tokens]
    return block_ids, keys, values


def run_case(backend, shapes, block_size, num_heads, num_kv_heads, head_size=16, seed=0, shared_prefix=None,
             num_padded_tokens=None, dtype=torch.float32, atol=1e-5):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    num_blocks = sum(-(-(c + q) // block_size) for c, q in shapes) + 5
    block_ids, keys, values = make_batch(rng, shapes, block_size, num_kv_heads, head_size, num_blocks,
                                         shared_prefix)
    ((key_cache, value_cache),) = allocate_kv_caches(1, num_blocks, block_size, num_kv_heads, head_size,
                                                     dtype, "cpu")
    key_cache.fill_(float("nan"))  # any read of an unwritten slot that reaches the output shows up as NaN
    value_cache.fill_(float("nan"))

    # Earlier steps wrote each request's context, except a shared prefix, which its writer writes now.
    for i, (context_len, _) in enumerate(shapes):
        start = shared_prefix[2] * block_size if shared_prefix is not None and i == shared_prefix[1] else 0
        if context_len > start:
            positions = torch.arange(start, context_len)
            slots = torch.tensor(block_ids[i])[positions // block_size] * block_size + positions % block_size
            reshape_and_cache(keys[i][start:context_len].to(dtype), values[i][start:context_len].to(dtype),
                              key_cache, value_cache, slots)

    metadata = build_attention_metadata([c for c, _ in shapes], [q for _, q in shapes], block_ids, block_size,
                                        num_padded_tokens=num_padded_tokens)
    queries = [torch.randn(q, num_heads, head_size) for _, q in shapes]
    total = num_padded_tokens or metadata.num_actual_tokens
    pad = total - metadata.num_actual_tokens
    query = torch.cat(queries + [torch.randn(pad, num_heads, head_size)]).to(dtype)
    key = torch.cat([k[c:] for k, (c, _) in zip(keys, shapes)] + [torch.randn(pad, num_kv_heads, head_size)])
    value = torch.cat([v[c:] for v, (c, _) in zip(values, shapes)] + [torch.randn(pad, num_kv_heads, head_size)])
    scale = 1 / math.sqrt(head_size)

    output = backend.forward(query, key.to(dtype), value.to(dtype), (key_cache, value_cache), metadata, scale)

    assert output.shape == query.shape and output.dtype == dtype
    for i, (context_len, query_len) in enumerate(shapes):
        start = metadata.query_start_loc_cpu[i]
        expected = dense_attention(queries[i].to(dtype), keys[i].to(dtype), values[i].to(dtype), context_len, scale)
        torch.testing.assert_close(output[start:start + query_len].double(), expected, atol=atol, rtol=atol,
                                   msg=f"request {i} (context {context_len}, query {query_len})")
    assert output[metadata.num_actual_tokens:].eq(0).all()
    return metadata


@pytest.fixture(scope="module")
def backend():
    return get_attention_backend("torch")


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (8, 2), (4, 1)])
def test_mixed_batch(backend, block_size, num_heads, num_kv_heads):
    shapes = [(37, 1), (0, 23), (50, 1), (33, 9), (0, 1), (5, 1), (64, 17), (block_size, 1)]
    run_case(backend, shapes, block_size, num_heads, num_kv_heads, seed=block_size + num_heads)


@pytest.mark.parametrize("seed", range(6))
def test_random_batches(backend, seed):
    rng = random.Random(1000 + seed)
    shapes = []
    for _ in range(rng.randint(1, 7)):
        kind = rng.choice(["decode", "prefill", "chunk"])
        context = 0 if kind == "prefill" else rng.randint(1, 90)
        shapes.append((context, 1 if kind == "decode" else rng.randint(2, 40)))
    run_case(backend, shapes, rng.choice([16, 32]), 6, 3, head_size=8, seed=seed)


def test_decode_only_and_prefill_only(backend):
    run_case(backend, [(10, 1), (70, 1), (1, 1)], 16, 4, 2)
    run_case(backend, [(0, 30), (17, 5)], 16, 4, 2)


def test_shared_prefix_block_written_in_the_same_step(backend):
    # Request 1's first block is filled by request 0 in this very step: it must be written before read.
    run_case(backend, [(0, 20), (16, 3), (16, 1)], 16, 4, 2, shared_prefix=(0, 1, 1))
    run_case(backend, [(0, 20), (16, 1)], 16, 4, 2, shared_prefix=(0, 1, 1))


def test_padding_rows_are_skipped_and_zero(backend):
    metadata = run_case(backend, [(9, 1), (0, 6)], 16, 4, 2, num_padded_tokens=12)
    assert metadata.slot_mapping[metadata.num_actual_tokens:].eq(-1).all()


def test_bfloat16(backend):
    run_case(backend, [(20, 1), (12, 7), (0, 5)], 16, 4, 2, dtype=torch.bfloat16, atol=3e-2)


def test_positions_and_slot_mapping():
    metadata = build_attention_metadata([5, 0], [2, 3], [[7, 2], [4]], block_size=4)
    assert compute_positions([5, 0], [2, 3]).tolist() == [5, 6, 0, 1, 2]
    assert metadata.slot_mapping.tolist() == [2 * 4 + 1, 2 * 4 + 2, 16, 17, 18]
    assert metadata.query_start_loc.tolist() == [0, 2, 5]
    assert metadata.seq_lens.tolist() == [7, 3]
    assert metadata.block_table.dtype == torch.int32 and metadata.block_table.tolist() == [[7, 2], [4, 0]]
    assert (metadata.max_query_len, metadata.max_seq_len) == (3, 7)
    assert metadata.num_computed_tokens_cpu == [5, 0]
    assert metadata.get_seq_start_loc().tolist() == [0, 7, 10]


def test_too_few_blocks_is_an_error():
    with pytest.raises(ValueError, match="request 0 needs 2 blocks"):
        build_attention_metadata([4], [1], [[0]], block_size=4)


def test_unknown_backend_name():
    with pytest.raises(ValueError, match="unknown attention backend 'nope'"):
        get_attention_backend("nope")
    instance = get_attention_backend("torch")
    assert isinstance(instance, AttentionBackend) and get_attention_backend(instance) is instance


def test_kv_cache_as_one_stacked_tensor(backend):
    # A per-layer cache may also be one [2, num_blocks, block_size, Hkv, D] tensor that unbinds into K and V.
    metadata = build_attention_metadata([0], [5], [[1]], block_size=8)
    kv_cache = torch.zeros(2, 3, 8, 2, 4)
    query, key, value = torch.randn(5, 4, 4), torch.randn(5, 2, 4), torch.randn(5, 2, 4)
    out = backend.forward(query, key, value, kv_cache, metadata, 0.5)
    assert torch.equal(kv_cache[0, 1, :5], key) and torch.equal(kv_cache[1, 1, :5], value)
    expected = backend.forward(query, key, value, (torch.zeros(3, 8, 2, 4), torch.zeros(3, 8, 2, 4)), metadata, 0.5)
    torch.testing.assert_close(out, expected)


def test_decode_groups_are_capped_in_padded_tokens():
    """Same-length decodes share a group until its padded tokens would pass the cap (decode_groups.py)."""
    from engine.runner.attention.decode_groups import make_decode_groups

    block_size, num_reqs = 16, 10
    seq_lens = [100] * num_reqs  # 7 blocks = 112 padded tokens each
    block_table = torch.arange(num_reqs * 8, dtype=torch.int32).view(num_reqs, 8)
    query_start_loc = list(range(num_reqs + 1))
    uncapped = make_decode_groups(list(range(num_reqs)), seq_lens, query_start_loc, block_table, block_size)
    assert [group.num_reqs for group in uncapped] == [10]
    capped = make_decode_groups(list(range(num_reqs)), seq_lens, query_start_loc, block_table, block_size,
                                max_group_tokens=3 * 112)
    assert [group.num_reqs for group in capped] == [3, 3, 3, 1]
    assert sorted(int(i) for group in capped for i in group.req_indices) == list(range(num_reqs))
    # A request longer than the cap still gets a group of its own.
    alone = make_decode_groups([0, 1], [500, 500], [0, 1, 2], block_table.repeat(1, 4), block_size,
                               max_group_tokens=100)
    assert [group.num_reqs for group in alone] == [1, 1]


def test_capped_groups_attend_like_the_reference(backend, monkeypatch):
    """A tiny gather budget splits every decode into its own group: results stay the reference's."""
    import engine.runner.attention.torch_backend as torch_backend

    monkeypatch.setattr(torch_backend, "GROUP_GATHER_BYTES", 1)
    run_case(backend, [(37, 1), (40, 1), (41, 1), (38, 1), (5, 1), (70, 9)], 16, 4, 2)


def test_prefill_chunks_attend_in_query_slices(backend, monkeypatch):
    """Slices of 4 query rows (each scoring keys up to its own last query only) attend like the reference,
    across slice edges, after a context, with GQA; so does the default slice at chunks longer than it."""
    import engine.runner.attention.torch_backend as torch_backend

    run_case(backend, [(0, 300), (40, 1), (130, 150)], 16, 4, 2, head_size=8, seed=3)
    monkeypatch.setattr(torch_backend, "PREFILL_QUERY_SLICE", 4)
    run_case(backend, [(0, 23), (37, 1), (18, 9), (5, 4), (0, 3)], 16, 8, 2, seed=4)
    run_case(backend, [(33, 17), (0, 8)], 32, 4, 4, seed=5)


def test_prefill_benchmark_times_both_slicings_and_restores_the_slice():
    """benchmarks.torch_prefill_attention on a tiny chunk: it runs, and leaves the backend's slice as it was."""
    import engine.runner.attention.torch_backend as torch_backend
    from benchmarks.torch_prefill_attention import prefill_seconds

    assert prefill_seconds(20, 16, 4, repeats=1) > 0 and prefill_seconds(20, 16, 1 << 30, repeats=1) > 0
    assert torch_backend.PREFILL_QUERY_SLICE == 128
