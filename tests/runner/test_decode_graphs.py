"""CUDA graphs for decode steps in the model runner: when they are used, and that padding changes nothing.

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


@requires_triton
def test_emulated_graph_path_gives_the_eager_tokens_and_leaves_the_cache_clean(tiny_llama_path):
    device = "cpu" if not torch.cuda.is_available() else "cuda"
    kwargs = dict(model=str(tiny_llama_path), device=device, attention_backend="triton", num_gpu_blocks=64,
                  max_num_seqs=8, skip_tokenizer_init=True, enforce_eager=True)
    eager = LLM(**kwargs)
    prompts, params = _workload(eager.model_runner.vocab_size)
    expected = _generate(eager, prompts, params)

    padded = LLM(**kwargs)
    runner = padded.model_runner
    runner.decode_graphs = runner.make_decode_graphs(emulate=True)
    runner.decode_graphs.capture()
    assert runner.decode_graphs.captured_sizes == [1, 2, 4, 8]
    batch_sizes = []
    forward = runner.decode_graphs.forward

    def counting_forward(prepared, block_table_rows):
        batch_sizes.append(prepared.common.num_reqs)
        return forward(prepared, block_table_rows)

    runner.decode_graphs.forward = counting_forward
    assert _generate(padded, prompts, params) == expected
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
