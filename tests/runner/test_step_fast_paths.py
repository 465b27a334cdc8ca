"""The runner's GPU step fast paths: CUDA graphs for decode steps, padded eager steps and the shape warm-up.

On the CPU the graph path runs emulated (``DecodeGraphs(emulate=True)``): the same static buffers, padding
up the batch-size ladder and forward over the padded views as a replay, without the capture. The triton
kernels run under the interpreter (tests/conftest.py). On a GPU the real capture is compared with eager.
"""

import random

import pytest
import torch

from engine import LLM, SamplingParams
from engine.runner.config import RunnerConfig
from engine.runner.decode_graphs import cuda_graphs_unavailable_reason
from kernels.triton_support import triton_unavailable_reason

requires_triton = pytest.mark.skipif(triton_unavailable_reason() is not None,
                                     reason=f"triton cannot run here: {triton_unavailable_reason()}")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_graphs_only_where_capture_is_safe():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert cuda_graphs_unavailable_reason(cuda, "triton", enforce_eager=False) is None
    assert "enforce_eager" in cuda_graphs_unavailable_reason(cuda, "triton", enforce_eager=True)
    assert "graphs need CUDA" in cuda_graphs_unavailable_reason(cpu, "triton", enforce_eager=False)
    for backend in ("torch", "flash_attn"):
        assert repr(backend) in cuda_graphs_unavailable_reason(cuda, backend, enforce_eager=False)
    # A mixture of experts sizes its expert matmuls on the host: its decode steps stay eager.
    from engine.models.gpt_oss import GptOssForCausalLM
    from engine.models.moe_model import MoeForCausalLM
    from engine.models.registry import MODEL_REGISTRY
    mixtures = {c for c in MODEL_REGISTRY.values() if issubclass(c, (MoeForCausalLM, GptOssForCausalLM))}
    # Mixtral, Qwen2-MoE, Qwen3-MoE (also Qwen3-VL-MoE's language model), DeepSeek-V2, DeepSeek-V3, GLM-4.5, gpt-oss
    assert len(mixtures) == 7
    for model_class in mixtures:
        reason = cuda_graphs_unavailable_reason(cuda, "triton", False, model_class.cuda_graph_unsafe_reason)
        assert "row counts are read on the host" in reason
    # Llama 4 (a mixture too) builds its chunked layers' metadata per step.
    from engine.models.llama4 import Llama4ForCausalLM
    assert "chunked local attention" in cuda_graphs_unavailable_reason(cuda, "triton", False,
                                                                       Llama4ForCausalLM.cuda_graph_unsafe_reason)
    dense = [c for c in MODEL_REGISTRY.values() if c not in mixtures and c is not Llama4ForCausalLM]
    assert all(c.cuda_graph_unsafe_reason is None for c in dense)


def test_bad_ladder_is_named():
    with pytest.raises(ValueError, match=r"cuda_graph_batch_sizes must be .*max_num_seqs=4.*\[0, 2\]"):
        RunnerConfig(model="x", max_num_seqs=4, cuda_graph_batch_sizes=[0, 2])
    with pytest.raises(ValueError, match="cuda_graph_batch_sizes"):
        RunnerConfig(model="x", max_num_seqs=4, cuda_graph_batch_sizes=[8])


def _workload(vocab_size: int, num_requests: int = 5, seed: int = 0):
    rng = random.Random(seed)
    prompts = [[rng.randrange(4, vocab_size) for _ in range(rng.randint(3, 40))] for _ in range(num_requests)]
    # Different output lengths: the decode batch shrinks 5 -> 1 through sizes that pad (5 -> 8, 3 -> 4).
    params = [SamplingParams(temperature=0.0, max_tokens=4 + 3 * i, ignore_eos=True) for i in range(num_requests)]
    return prompts, params


def _generate(llm: LLM, prompts, params) -> list[list[int]]:
    return [output.outputs[0].token_ids for output in llm.generate(prompts, params, use_tqdm=False)]


def _generate_through_emulated_graphs(llm: LLM, prompts, params) -> tuple[list[list[int]], list[int]]:
    """The tokens with every decode step on the emulated graph path, and the batch size of each such step."""
    runner = llm.model_runner
    runner.decode_graphs = runner.make_decode_graphs(emulate=True)
    runner.decode_graphs.capture()
    batch_sizes = []
    forward = runner.decode_graphs.forward

    def counting_forward(prepared, block_table_rows):
        batch_sizes.append(prepared.common.num_reqs)
        return forward(prepared, block_table_rows)

    runner.decode_graphs.forward = counting_forward
    return _generate(llm, prompts, params), batch_sizes


@requires_triton
def test_emulated_graph_path_gives_the_eager_tokens_and_leaves_the_cache_clean(tiny_llama_path):
    device = "cpu" if not torch.cuda.is_available() else "cuda"
    kwargs = dict(model=str(tiny_llama_path), device=device, attention_backend="triton", num_gpu_blocks=64,
                  max_num_seqs=8, skip_tokenizer_init=True, enforce_eager=True)
    eager = LLM(**kwargs)
    prompts, params = _workload(eager.model_runner.vocab_size)
    expected = _generate(eager, prompts, params)

    padded = LLM(**kwargs)
    tokens, batch_sizes = _generate_through_emulated_graphs(padded, prompts, params)
    assert padded.model_runner.decode_graphs.captured_sizes == [1, 2, 4, 8]
    assert tokens == expected
    assert {5, 3, 1} <= set(batch_sizes), f"decode steps should have taken the padded path, saw {batch_sizes}"
    assert padded.scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == 63  # all but the null block


@needs_cuda
@requires_triton
def test_captured_graphs_give_the_eager_tokens_and_transformers_tokens(tiny_llama_path):
    from tests.engine.model_fixtures import hf_greedy, load_hf_model

    kwargs = dict(model=str(tiny_llama_path), device="cuda", attention_backend="triton", dtype="float32",
                  num_gpu_blocks=64, max_num_seqs=8, skip_tokenizer_init=True)
    eager = LLM(**kwargs, enforce_eager=True)
    assert eager.model_runner.decode_graphs is None
    prompts, params = _workload(eager.model_runner.vocab_size, num_requests=7)
    expected = _generate(eager, prompts, params)
    graphed = LLM(**kwargs)
    assert graphed.model_runner.decode_graphs.captured_sizes == [1, 2, 4, 8]
    assert _generate(graphed, prompts, params) == expected
    hf_model = load_hf_model(tiny_llama_path)
    for prompt, param, tokens in zip(prompts, params, expected):
        assert tokens == hf_greedy(hf_model, prompt, param.max_tokens)


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=requires_triton)])
def test_padded_eager_steps_give_the_unpadded_tokens(tiny_llama_path, backend):
    """Eager steps padded to a multiple of 64 tokens (the CUDA default, forced here on the CPU): padded rows
    write no cache slot and belong to no request, so every token and every freed block is as without."""
    from engine.runner.eager_shapes import pad_step_inputs, padded_token_count

    kwargs = dict(model=str(tiny_llama_path), attention_backend=backend, num_gpu_blocks=64, max_num_seqs=8,
                  max_num_batched_tokens=48, skip_tokenizer_init=True)
    plain = LLM(**kwargs)
    assert plain.model_runner.eager_token_padding == 1  # the CPU default
    prompts, params = _workload(plain.model_runner.vocab_size)
    expected = _generate(plain, prompts, params)

    padded = LLM(**kwargs)
    padded.model_runner.eager_token_padding = 64
    padded_lengths = []
    import engine.runner.model_runner as model_runner_module

    def recording_pad(input_ids, positions, common, padding):
        result = pad_step_inputs(input_ids, positions, common, padding)
        padded_lengths.append((len(input_ids), len(result[0])))
        return result

    original = model_runner_module.pad_step_inputs
    model_runner_module.pad_step_inputs = recording_pad
    try:
        assert _generate(padded, prompts, params) == expected
    finally:
        model_runner_module.pad_step_inputs = original
    assert padded_lengths and all(after == padded_token_count(before, 64) for before, after in padded_lengths)
    assert any(after > before for before, after in padded_lengths)
    assert padded.scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == 63


def test_token_padding_defaults_and_shapes():
    import numpy as np

    from engine.runner.eager_shapes import pad_step_inputs, resolve_token_padding
    from engine.runner.prepare_inputs import CommonAttentionMetadata

    assert resolve_token_padding(None, torch.device("cuda")) == 64
    assert resolve_token_padding(None, torch.device("cpu")) == 1
    assert resolve_token_padding(16, torch.device("cpu")) == 16
    with pytest.raises(ValueError, match="eager_token_padding must be None or an integer >= 1, got 0"):
        RunnerConfig(model="x", eager_token_padding=0)
    common = CommonAttentionMetadata(
        num_reqs=1, num_actual_tokens=3, query_start_loc=np.array([0, 3], np.int32), seq_lens=np.array([3], np.int32),
        num_computed_tokens=np.array([0], np.int32), block_table=np.zeros((1, 1), np.int32),
        slot_mapping=np.array([5, 6, 7]), is_prefilling=np.array([True]), max_query_len=3, max_seq_len=3)
    ids, positions, padded = pad_step_inputs(np.array([9, 8, 7]), np.array([0, 1, 2]), common, 4)
    assert ids.tolist() == [9, 8, 7, 0] and positions.tolist() == [0, 1, 2, 0]
    assert padded.slot_mapping.tolist() == [5, 6, 7, -1] and padded.num_actual_tokens == 3
    assert pad_step_inputs(np.array([1, 2, 3, 4]), np.arange(4), common, 4)[2] is common  # already a multiple


def test_shape_warm_up_runs_every_padded_size_and_writes_nothing(tiny_llama_path):
    from engine.runner.eager_shapes import warm_up_shapes

    llm = LLM(model=str(tiny_llama_path), num_gpu_blocks=16, max_num_seqs=3, skip_tokenizer_init=True)
    runner = llm.model_runner
    before = [(key.clone(), value.clone()) for key, value in runner.kv_caches]
    runs = warm_up_shapes(runner.model, runner.kv_caches, runner.device, max_num_tokens=130, padding=64,
                          max_num_reqs=3)
    assert runs == 3  # 64, 128, 192
    for (key, value), (key_before, value_before) in zip(runner.kv_caches, before):
        assert torch.equal(key, key_before) and torch.equal(value, value_before)


@requires_triton
def test_emulated_graphs_with_a_hybrid_kv_cache_give_the_eager_tokens(tmp_path):
    """A Qwen2 with one full and one windowed layer, so its KV cache is hybrid: each graph carries a static block
    table and slot mapping per group, and replays give the tokens of eager steps, and of one table."""
    import json

    from engine.models import make_test_model

    path = make_test_model(tmp_path / "qwen2", "qwen2", num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                           num_attention_heads=2, num_key_value_heads=1)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "sliding_window": 8, "use_sliding_window": True,
                                                  "max_window_layers": 1}))
    device = "cpu" if not torch.cuda.is_available() else "cuda"
    kwargs = dict(model=str(path), device=device, attention_backend="triton", num_gpu_blocks=64, max_num_seqs=8,
                  skip_tokenizer_init=True, enforce_eager=True)
    one_table = LLM(**kwargs, disable_hybrid_kv_cache_manager=True)
    prompts, params = _workload(one_table.model_runner.vocab_size)
    expected = _generate(one_table, prompts, params)
    eager = LLM(**kwargs)
    assert eager.scheduler.cache_config.kv_cache_groups == (None, 8)
    assert _generate(eager, prompts, params) == expected

    tokens, batch_sizes = _generate_through_emulated_graphs(LLM(**kwargs), prompts, params)
    assert tokens == expected
    assert {5, 3, 1} <= set(batch_sizes), f"decode steps should have taken the padded path, saw {batch_sizes}"
