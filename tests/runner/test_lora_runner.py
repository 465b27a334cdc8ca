"""Multi-LoRA serving in the real runner equals transformers with each adapter merged into its weights.

Two generated adapters of the "small" model (different ranks and targets, one with rsLoRA) and the base
model share batches. The reference is transformers' model with W + scale * B @ A written into a copy of its
weights by hand (tests/engine/lora_fixtures.py), generating each prompt alone, in float32 on the CPU:
greedy tokens must be equal and the first step's logprobs within float tolerance.
"""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.core import LoRARequest
from engine.models import default_model_path
from kernels.triton_support import triton_unavailable_reason
from tests.engine.lora_fixtures import make_adapters, merged_hf_model
from tests.engine.model_fixtures import hf_greedy, hf_logits, load_hf_model

MAX_TOKENS = 10
# Prompts of different lengths (the longest is cut into chunks by a 64-token budget).
PROMPT_LENGTHS = [5, 70, 23, 41, 9, 33]
ADAPTER_OF_PROMPT = [None, "alpha", "beta", None, "alpha", "beta"]
LOGPROB_ATOL = 1e-4


@pytest.fixture(scope="module")
def small_path(tmp_path_factory):
    return default_model_path("small", cache_dir=tmp_path_factory.mktemp("servesim-cache"))


@pytest.fixture(scope="module")
def adapters(small_path, tmp_path_factory):
    return make_adapters(tmp_path_factory.mktemp("adapters"), small_path)


@pytest.fixture(scope="module")
def lora_requests(adapters):
    return {name: LoRARequest(name, index + 1, str(path)) for index, (name, path) in enumerate(adapters.items())}


@pytest.fixture(scope="module")
def prompts():
    generator = torch.Generator().manual_seed(5)
    return [torch.randint(4, 8192, (length,), generator=generator).tolist() for length in PROMPT_LENGTHS]


@pytest.fixture(scope="module")
def references(small_path, adapters):
    """name (None: the base model) -> transformers' model, merged with that adapter."""
    base = load_hf_model(small_path)
    return {None: base, **{name: merged_hf_model(base, path) for name, path in adapters.items()}}


@pytest.fixture(scope="module")
def expected(references, prompts):
    return [hf_greedy(references[name], prompt, MAX_TOKENS) for name, prompt in zip(ADAPTER_OF_PROMPT, prompts)]


def greedy(logprobs: int | None = None) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=logprobs)


def make_llm(small_path, **kwargs) -> LLM:
    options = dict(model=str(small_path), enable_lora=True, max_loras=2, max_num_seqs=8, num_gpu_blocks=128,
                   max_num_batched_tokens=64)
    options.update(kwargs)
    return LLM(**options)


def assert_all_blocks_free(llm: LLM) -> None:
    manager = llm.scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks


def test_adapters_change_the_greedy_tokens(references, prompts):
    """Otherwise the equalities below would prove nothing: one prompt, three models, three continuations."""
    outputs = {name: tuple(hf_greedy(model, prompts[2], MAX_TOKENS)) for name, model in references.items()}
    assert len(set(outputs.values())) == 3


CONFIGS = {
    "chunked_prefill": {},
    "speculative_decoding": dict(speculative_config={"method": "ngram", "num_speculative_tokens": 3}),
}


@pytest.mark.parametrize("config", list(CONFIGS))
def test_mixed_batch_equals_merged_transformers(small_path, lora_requests, prompts, references, expected, config):
    llm = make_llm(small_path, **CONFIGS[config])
    requests = [None if name is None else lora_requests[name] for name in ADAPTER_OF_PROMPT]
    outputs = llm.generate(prompts, greedy(logprobs=5), use_tqdm=False, lora_request=requests)
    for index, (output, want) in enumerate(zip(outputs, expected)):
        assert output.outputs[0].token_ids == want, f"prompt {index} ({ADAPTER_OF_PROMPT[index]}), {config}"
    # The first sampled position's logprobs equal the merged reference's (logits up to a constant).
    for index, output in enumerate(outputs):
        reference = torch.log_softmax(hf_logits(references[ADAPTER_OF_PROMPT[index]], prompts[index])[-1], dim=-1)
        for token_id, logprob in output.outputs[0].logprobs[0].items():
            assert logprob.logprob == pytest.approx(reference[token_id].item(), abs=LOGPROB_ATOL), f"prompt {index}"
    assert_all_blocks_free(llm)

    # Base-model rows equal an engine without LoRA (logprobs to rounding: the batches' shapes differ).
    plain = LLM(model=str(small_path), max_num_seqs=8, num_gpu_blocks=128, max_num_batched_tokens=64)
    base_prompts = [prompt for prompt, name in zip(prompts, ADAPTER_OF_PROMPT) if name is None]
    base_outputs = [output for output, name in zip(outputs, ADAPTER_OF_PROMPT) if name is None]
    plain_outputs = plain.generate(base_prompts, greedy(logprobs=5), use_tqdm=False)
    for mixed, alone in zip(base_outputs, plain_outputs):
        assert mixed.outputs[0].token_ids == alone.outputs[0].token_ids
        for mixed_position, alone_position in zip(mixed.outputs[0].logprobs, alone.outputs[0].logprobs):
            assert list(mixed_position) == list(alone_position)
            assert [p.logprob for p in mixed_position.values()] == pytest.approx(
                [p.logprob for p in alone_position.values()], abs=1e-5)


def test_prefix_cache_keeps_each_adapters_kv_apart(small_path, lora_requests, prompts, references):
    """The same prompt under alpha, then beta, then alpha: beta must not reuse alpha's KV, alpha again must."""
    prompt = prompts[1]  # 70 tokens: four full blocks
    want = {name: hf_greedy(references[name], prompt, MAX_TOKENS) for name in ("alpha", "beta")}
    llm = make_llm(small_path)
    cached = []
    for name in ("alpha", "beta", "alpha"):
        output = llm.generate([prompt], greedy(), use_tqdm=False, lora_request=lora_requests[name])[0]
        assert output.outputs[0].token_ids == want[name], name
        cached.append(output.num_cached_tokens)
    assert cached == [0, 0, 64]
    assert_all_blocks_free(llm)


def test_one_slot_serves_two_adapters_in_turn(small_path, lora_requests, prompts, expected):
    """max_loras=1: the core runs one adapter's requests at a time, the slot is refilled (least recently used
    out), and the host cache (max_cpu_loras=2) keeps both adapters, so neither is read from disk twice."""
    llm = make_llm(small_path, max_loras=1, max_cpu_loras=2)
    requests = [None if name is None else lora_requests[name] for name in ADAPTER_OF_PROMPT]
    for _ in range(2):
        outputs = llm.generate(prompts, greedy(), use_tqdm=False, lora_request=requests)
        assert [output.outputs[0].token_ids for output in outputs] == expected
    lora = llm.model_runner.lora
    assert lora.slots.num_slot_loads >= 4  # alpha, beta, then alpha and beta again through one slot
    assert lora.host_cache.num_loads == 2
    assert_all_blocks_free(llm)


def test_host_cache_smaller_than_the_adapters_reads_them_again(small_path, lora_requests, prompts, expected):
    llm = make_llm(small_path, max_loras=1, max_cpu_loras=1)
    requests = [None if name is None else lora_requests[name] for name in ADAPTER_OF_PROMPT]
    outputs = llm.generate(prompts, greedy(), use_tqdm=False, lora_request=requests)
    assert [output.outputs[0].token_ids for output in outputs] == expected
    assert llm.model_runner.lora.host_cache.num_loads > 2


def test_preemption_with_adapters_gives_the_same_tokens(small_path, lora_requests, prompts, expected):
    llm = make_llm(small_path, num_gpu_blocks=8, enable_prefix_caching=False)
    requests = [None if name is None else lora_requests[name] for name in ADAPTER_OF_PROMPT]
    outputs = llm.generate(prompts, greedy(), use_tqdm=False, lora_request=requests)
    assert [output.outputs[0].token_ids for output in outputs] == expected
    assert llm.scheduler.num_preemptions_total > 0
    assert_all_blocks_free(llm)


@pytest.mark.skipif(triton_unavailable_reason() is not None, reason="the emulated graph path needs triton")
def test_decode_graphs_never_run_a_step_with_an_adapter(tiny_llama_path, tmp_path):
    """Captured graphs hold no adapter: with them on (emulated through the triton backend, on the tiny model),
    steps with an adapter run eagerly and give the eager engine's tokens; base-only decodes use the graphs."""
    adapters = make_adapters(tmp_path, tiny_llama_path)
    requests = [None, LoRARequest("alpha", 1, str(adapters["alpha"])), None, LoRARequest("beta", 2, str(adapters["beta"]))]
    tiny_prompts = [[5 + index] * (3 + 7 * index) for index in range(4)]
    device = "cpu" if not torch.cuda.is_available() else "cuda"
    kwargs = dict(model=str(tiny_llama_path), device=device, attention_backend="triton", num_gpu_blocks=64,
                  max_num_seqs=8, skip_tokenizer_init=True, enforce_eager=True, enable_lora=True, max_loras=2)
    expected = [output.outputs[0].token_ids for output in
                LLM(**kwargs).generate(tiny_prompts, greedy(), use_tqdm=False, lora_request=requests)]
    llm = LLM(**kwargs)
    runner = llm.model_runner
    runner.decode_graphs = runner.make_decode_graphs(emulate=True)
    runner.decode_graphs.capture()
    graph_steps = []  # each graph step's rows' adapter ids
    forward = runner.decode_graphs.forward

    def recording_forward(prepared, block_table_rows):
        graph_steps.append(runner.input_batch.lora_int_ids[:prepared.common.num_reqs].tolist())
        return forward(prepared, block_table_rows)

    runner.decode_graphs.forward = recording_forward
    outputs = llm.generate(tiny_prompts, greedy(), use_tqdm=False, lora_request=requests)
    assert [output.outputs[0].token_ids for output in outputs] == expected
    assert graph_steps == []  # every decode step of that batch had an adapter row
    base_only = llm.generate(tiny_prompts[::2], greedy(), use_tqdm=False)
    assert [output.outputs[0].token_ids for output in base_only] == expected[::2]
    assert graph_steps and all(ids == [0] * len(ids) for ids in graph_steps)


def test_a_batch_without_adapters_does_no_lora_work(small_path, prompts):
    """enable_lora with base-model requests only: the same tensor operations as an engine without LoRA."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class CountOps(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    counts = []
    for enable_lora in (False, True):
        llm = make_llm(small_path, enable_lora=enable_lora)
        llm.generate(prompts[:1], greedy(), use_tqdm=False)  # warm up any lazy state
        with CountOps() as mode:
            llm.generate(prompts[:3], greedy(), use_tqdm=False)
        counts.append(mode.ops)
    assert len(counts[0]) > 100 and counts[0] == counts[1]


def test_slots_evict_the_least_recently_used_adapter_the_batch_does_not_use():
    from engine.runner.lora.device_slots import LoRASlots

    slots = LoRASlots([], max_loras=2)
    loads = []

    def get_weights(request):
        loads.append(request.lora_int_id)
        return None  # no modules to fill

    adapter = {lora_id: LoRARequest(f"a{lora_id}", lora_id, "") for lora_id in range(1, 5)}
    assert slots.assign([adapter[1], adapter[2]], get_weights) == {1: 0, 2: 1}
    assert slots.assign([adapter[1]], get_weights) == {1: 0}  # 2 is now the least recently used
    assert slots.assign([adapter[3]], get_weights) == {3: 1}
    assert slots.assign([adapter[3], adapter[1]], get_weights) == {3: 1, 1: 0}  # resident: nothing copied
    assert slots.assign([adapter[4], adapter[3]], get_weights) == {4: 0, 3: 1}  # 1 goes: 3 is in the batch
    assert loads == [1, 2, 3, 4]
    with pytest.raises(RuntimeError, match="the batch uses 3 LoRA adapters, more than max_loras 2"):
        slots.assign([adapter[1], adapter[2], adapter[3]], get_weights)
