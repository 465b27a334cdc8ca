"""DecodeCudaGraphRunner: ladder and padding logic on CPU; capture and replay on a GPU."""

import importlib.util

import pytest
import torch

from engine.runner.cuda_graph_runner import (DecodeCudaGraphRunner, StaticInput, decode_input_specs,
                                       default_batch_size_ladder, normalize_ladder, pad_into, padded_batch_size)


def test_default_ladder_is_powers_of_two_then_the_maximum():
    assert default_batch_size_ladder(1) == [1]
    assert default_batch_size_ladder(8) == [1, 2, 4, 8]
    assert default_batch_size_ladder(100) == [1, 2, 4, 8, 16, 32, 64, 100]
    with pytest.raises(ValueError, match="max_batch_size"):
        default_batch_size_ladder(0)


def test_custom_ladder_is_sorted_deduplicated_and_bounded():
    assert normalize_ladder([8, 1, 4, 4], 8) == [1, 4, 8]
    with pytest.raises(ValueError, match="batch_size_ladder"):
        normalize_ladder([1, 16], 8)
    with pytest.raises(ValueError, match="batch_size_ladder"):
        normalize_ladder([], 8)


@pytest.mark.parametrize("batch,expected", [(1, 1), (2, 2), (3, 4), (5, 8), (8, 8), (9, 24), (24, 24), (25, None)])
def test_padded_size_is_the_smallest_captured_size_that_fits(batch, expected):
    assert padded_batch_size(batch, [1, 2, 4, 8, 24]) == expected


def test_padding_follows_the_decode_rules():
    specs = {spec.name: spec for spec in decode_input_specs(max_num_blocks_per_req=3)}
    buffers = {name: torch.full((8 + spec.extra_rows, *spec.trailing_shape), 99, dtype=spec.dtype)
               for name, spec in specs.items()}
    real = {
        "input_ids": torch.tensor([5, 6, 7]),
        "positions": torch.tensor([10, 3, 40]),
        "slot_mapping": torch.tensor([170, 51, 640]),
        "seq_lens": torch.tensor([11, 4, 41], dtype=torch.int32),
        "query_start_loc": torch.tensor([0, 1, 2, 3], dtype=torch.int32),
        "block_table": torch.tensor([[10, 0, 0], [3, 0, 0], [40, 2, 0]], dtype=torch.int32),
    }
    for name, spec in specs.items():
        pad_into(buffers[name], real[name], spec, batch_size=3, padded=4)
    assert buffers["slot_mapping"][:5].tolist() == [170, 51, 640, -1, 99]  # row 4 is beyond the padded size
    assert buffers["seq_lens"][:4].tolist() == [11, 4, 41, 0]
    assert buffers["query_start_loc"][:6].tolist() == [0, 1, 2, 3, 3, 99]  # the padded request owns no token
    assert buffers["block_table"][3].tolist() == [0, 0, 0]
    assert buffers["input_ids"][3] == 0 and buffers["positions"][3] == 0


def test_wrong_input_shape_is_reported_by_name():
    spec = StaticInput("seq_lens", torch.int32)
    with pytest.raises(ValueError, match="'seq_lens' has shape"):
        pad_into(torch.zeros(8, dtype=torch.int32), torch.zeros(4, dtype=torch.int32), spec, 3, 4)


def test_disabled_or_cpu_runner_runs_eagerly_on_the_unpadded_inputs():
    seen = []

    def forward(inputs):
        seen.append(inputs["x"].shape[0])
        return inputs["x"] * 2

    for runner in (DecodeCudaGraphRunner(forward, 8, [StaticInput("x", torch.float32)], enabled=False),
                   DecodeCudaGraphRunner(forward, 8, [StaticInput("x", torch.float32)], device="cpu")):
        runner.capture()  # a no-op when disabled
        assert not runner.enabled and runner.captured_sizes == []
        assert runner.run(3, {"x": torch.ones(3)}).tolist() == [2.0, 2.0, 2.0]
    assert seen == [3, 3]


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")


@needs_cuda
def test_replay_matches_eager_for_every_batch_size():
    weight = torch.randn(16, 16, device="cuda")

    def forward(inputs):
        hidden = torch.nn.functional.one_hot(inputs["input_ids"], 16).float() @ weight
        return hidden + inputs["positions"][:, None]

    specs = [StaticInput("input_ids", torch.long), StaticInput("positions", torch.long)]
    runner = DecodeCudaGraphRunner(forward, 8, specs)
    runner.capture()
    assert runner.captured_sizes == [1, 2, 4, 8]
    for batch in (1, 3, 5, 8, 2):
        inputs = {"input_ids": torch.randint(0, 16, (batch,), device="cuda"),
                  "positions": torch.randint(0, 100, (batch,), device="cuda")}
        torch.testing.assert_close(runner.run(batch, inputs).clone(), forward(inputs))
    too_big = {"input_ids": torch.zeros(9, dtype=torch.long, device="cuda"),
               "positions": torch.zeros(9, dtype=torch.long, device="cuda")}
    assert runner.run(9, too_big).shape[0] == 9  # eager fallback


@needs_cuda
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
def test_triton_backend_decode_step_replays_in_a_graph():
    """Cache write + paged attention captured once, replayed for smaller batches with padding."""
    from engine.runner.attention import AttentionMetadata, get_attention_backend

    backend = get_attention_backend("triton")
    block_size, num_blocks, heads, kv_heads, head_size, width = 16, 64, 4, 2, 64, 4
    key_cache = torch.zeros(num_blocks, block_size, kv_heads, head_size, device="cuda", dtype=torch.bfloat16)
    value_cache = torch.zeros_like(key_cache)
    projection = torch.randn(1000, (heads + 2 * kv_heads) * head_size, device="cuda", dtype=torch.bfloat16)

    def forward(inputs):
        padded = inputs["input_ids"].shape[0]
        qkv = projection[inputs["input_ids"]]
        query = qkv[:, :heads * head_size].reshape(padded, heads, head_size)
        key = qkv[:, heads * head_size:(heads + kv_heads) * head_size].reshape(padded, kv_heads, head_size)
        value = qkv[:, (heads + kv_heads) * head_size:].reshape(padded, kv_heads, head_size)
        metadata = AttentionMetadata(
            num_actual_tokens=padded, query_start_loc=inputs["query_start_loc"], seq_lens=inputs["seq_lens"],
            block_table=inputs["block_table"], slot_mapping=inputs["slot_mapping"], max_query_len=1,
            max_seq_len=width * block_size, query_start_loc_cpu=list(range(padded + 1)), seq_lens_cpu=[1] * padded)
        return backend.forward(query, key, value, (key_cache, value_cache), metadata, head_size ** -0.5)

    runner = DecodeCudaGraphRunner(forward, 8, decode_input_specs(width))
    runner.capture()
    assert key_cache.eq(0).all(), "capture and warm-up must not write the cache (all slots are -1)"
    for batch in (3, 8, 1):
        # Request i owns blocks [i*width, (i+1)*width); its context is whatever the cache holds.
        seq_lens = torch.randint(1, width * block_size, (batch,), dtype=torch.int32, device="cuda")
        block_table = (torch.arange(batch * width, dtype=torch.int32, device="cuda")).view(batch, width)
        position = seq_lens.long() - 1
        inputs = {"input_ids": torch.randint(0, 1000, (batch,), device="cuda"), "positions": position,
                  "slot_mapping": block_table.long().gather(1, (position // block_size)[:, None])[:, 0] * block_size
                  + position % block_size,
                  "seq_lens": seq_lens, "block_table": block_table,
                  "query_start_loc": torch.arange(batch + 1, dtype=torch.int32, device="cuda")}
        saved = (key_cache.clone(), value_cache.clone())
        replayed = runner.run(batch, inputs).clone()
        key_cache.copy_(saved[0])
        value_cache.copy_(saved[1])
        eager = forward(inputs)
        torch.testing.assert_close(replayed.float(), eager.float(), atol=1e-2, rtol=1e-2)
