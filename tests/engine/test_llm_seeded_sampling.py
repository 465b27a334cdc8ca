"""A seeded request samples the same tokens whatever else is in the engine with it.

Each seeded request owns a torch.Generator for its whole life, and draws from it only in steps where
it samples: not in partial prefill chunks, and not again when it is recomputed after a preemption.
The tiny model's distribution is nearly flat, so the tokens are decided by the random draws: any
disturbance of a request's random stream shows up as different tokens.
"""

import pytest

from engine import LLM, SamplingParams
from tests.engine.model_fixtures import mixed_prompts

SEEDED = SamplingParams(temperature=1.0, seed=1234, max_tokens=12, ignore_eos=True)


def others(vocab_size):
    prompts = mixed_prompts(vocab_size, seed=21, num_prompts=7)
    params = [
        SamplingParams(temperature=0.9, seed=7, max_tokens=9, ignore_eos=True),
        SamplingParams(temperature=1.0, max_tokens=14, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True),
        SamplingParams(temperature=0.7, top_k=20, top_p=0.9, seed=3, max_tokens=11, ignore_eos=True),
        SamplingParams(temperature=1.0, seed=99, max_tokens=16, ignore_eos=True, logprobs=2,
                       presence_penalty=0.5, repetition_penalty=1.2),
        SamplingParams(temperature=1.2, min_p=0.001, seed=5, max_tokens=3, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=13, ignore_eos=True, frequency_penalty=0.3),
    ]
    return prompts, params


@pytest.fixture(scope="module")
def alone(tiny_llama_path):
    llm = LLM(model=str(tiny_llama_path), max_num_seqs=8)
    prompt = mixed_prompts(llm.model_runner.vocab_size, seed=20, num_prompts=1)[0]
    return prompt, llm.generate([prompt], SEEDED, use_tqdm=False)[0].outputs[0].token_ids


@pytest.mark.parametrize("config", [
    dict(),
    dict(max_num_batched_tokens=24),  # the seeded prompt is prefilled in chunks
    dict(num_gpu_blocks=8, enable_prefix_caching=False),  # preemption and recomputation
], ids=["batched", "chunked", "preempted"])
def test_same_tokens_alone_and_in_a_batch(tiny_llama_path, alone, config):
    prompt, expected = alone
    llm = LLM(model=str(tiny_llama_path), max_num_seqs=8, **config)
    other_prompts, other_params = others(llm.model_runner.vocab_size)
    # The seeded request in the middle of the batch, so its row moves as others finish.
    prompts = other_prompts[:3] + [prompt] + other_prompts[3:]
    params = other_params[:3] + [SEEDED] + other_params[3:]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert outputs[3].outputs[0].token_ids == expected
    if "num_gpu_blocks" in config:
        assert llm.scheduler.num_preemptions_total > 0
    # The other seeded requests are reproducible too: the same batch again gives the same tokens.
    again = llm.generate(prompts, params, use_tqdm=False)
    for first, second, p in zip(outputs, again, params):
        if p.seed is not None or p.temperature == 0.0:
            assert first.outputs[0].token_ids == second.outputs[0].token_ids


def test_different_seed_different_tokens(tiny_llama_path, alone):
    prompt, expected = alone
    llm = LLM(model=str(tiny_llama_path), max_num_seqs=8)
    other = llm.generate([prompt], SamplingParams(temperature=1.0, seed=4321, max_tokens=12, ignore_eos=True),
                         use_tqdm=False)
    assert other[0].outputs[0].token_ids != expected


def test_engine_seed_makes_unseeded_sampling_reproducible(tiny_llama_path):
    prompts = mixed_prompts(512, seed=30, num_prompts=3)
    params = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True)
    runs = [[o.outputs[0].token_ids for o in LLM(model=str(tiny_llama_path), seed=seed, max_num_seqs=4)
             .generate(prompts, params, use_tqdm=False)] for seed in (0, 0, 1)]
    assert runs[0] == runs[1] and runs[0] != runs[2]
