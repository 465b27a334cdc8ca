"""Speculative decoding with a draft model (speculative_config={"method": "draft_model", "model": PATH, ...}).

Greedy requests produce exactly the tokens of decoding one token per step, whatever the draft proposes, through
chunked prefill, preemption and the prefix cache. A draft equal to the target has every draft accepted: it proves
that the draft's KV cache, kept block for block beside the target's, holds the right keys at every position it
reads (after a prefix-cache hit, after a preemption, after rejected drafts).
"""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.core import CacheConfig, Request, Scheduler, SchedulerConfig
from engine.core.sampling_params import SamplingParams as CoreSamplingParams
from engine.models import make_test_model
from tests.engine.spec_decode_helpers import (ENGINE_VARIANTS, GREEDY_30, assert_greedy_tokens_unchanged,
                                              generate_tokens, random_prompts)
from engine.models.layer_skip_draft import write_layer_skip_draft
from engine.runner.spec_decode import SpeculativeConfig


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return make_test_model(tmp_path_factory.mktemp("target"), "llama", seed=1, num_hidden_layers=3)


@pytest.fixture(scope="module")
def shallow_draft(target, tmp_path_factory):
    """The target's first layer: it agrees with the target part of the time."""
    return write_layer_skip_draft(target, tmp_path_factory.mktemp("shallow") / "draft", 1)


@pytest.fixture(scope="module")
def identical_draft(target, tmp_path_factory):
    """Every layer: the target itself, in another folder."""
    return write_layer_skip_draft(target, tmp_path_factory.mktemp("identical") / "draft", 3)




def _draft(path, k=3):
    return {"method": "draft_model", "model": str(path), "num_speculative_tokens": k}


GREEDY = GREEDY_30


@pytest.mark.parametrize("engine_kwargs", ENGINE_VARIANTS)
def test_greedy_tokens_are_those_of_decoding_one_token_per_step(target, shallow_draft, engine_kwargs):
    llm = assert_greedy_tokens_unchanged(target, _draft(shallow_draft), engine_kwargs)
    stats = llm.engine_core.scheduler.make_stats().spec_decoding
    assert 0 < stats["num_accepted_tokens"] < stats["num_draft_tokens"]


def test_a_draft_equal_to_the_target_has_every_draft_accepted(target, identical_draft):
    llm = LLM(model=str(target), skip_tokenizer_init=True, speculative_config=_draft(identical_draft, 4),
              num_gpu_blocks=10, max_num_seqs=4, max_num_batched_tokens=24, max_model_len=128)
    prompts = random_prompts(6, length=40)
    assert generate_tokens(llm, prompts, GREEDY) == generate_tokens(LLM(model=str(target), skip_tokenizer_init=True), prompts,
                                                       GREEDY)
    scheduler = llm.scheduler
    assert scheduler.num_preemptions_total > 0  # resumed requests' draft KV came back with them
    stats = scheduler.make_stats().spec_decoding
    assert stats["num_draft_tokens"] > 0 and stats["num_accepted_tokens"] == stats["num_draft_tokens"]
    # A later request hits the first one's cached blocks: the draft's KV is in them too.
    roomy = LLM(model=str(target), skip_tokenizer_init=True, speculative_config=_draft(identical_draft, 4))
    generate_tokens(roomy, prompts[:1], GREEDY)
    generate_tokens(roomy, [prompts[0][:32] + [7, 8, 9]], GREEDY)
    assert roomy.scheduler.kv_cache_manager.prefix_cache_stats.hits >= 32
    stats = roomy.scheduler.make_stats().spec_decoding
    assert stats["num_accepted_tokens"] == stats["num_draft_tokens"] > 0


def test_a_draft_runs_on_the_hybrid_kv_cache_beside_the_full_groups_blocks(tmp_path):
    """A target whose windowed layers hand blocks back (Cohere2: an 8-token window on three layers of four) drafting
    for itself: the draft reads and writes beside the full group's blocks, which stay whole, so every draft is
    accepted, through preemption."""
    hybrid = make_test_model(tmp_path / "hybrid", "cohere2", seed=2, num_hidden_layers=4)
    options = dict(model=str(hybrid), skip_tokenizer_init=True, max_model_len=128)
    prompts = random_prompts(5, length=10)  # short prompts, so that four run at once and outgrow the pool
    expected = generate_tokens(LLM(**options), prompts, GREEDY)
    llm = LLM(**options, speculative_config=_draft(hybrid, 3), num_gpu_blocks=44, max_num_seqs=4,
              max_num_batched_tokens=24, block_size=4)
    assert llm.scheduler.cache_config.kv_cache_groups == (None, 8, 8, 8)
    assert generate_tokens(llm, prompts, GREEDY) == expected
    assert llm.scheduler.num_preemptions_total > 0
    stats = llm.scheduler.make_stats().spec_decoding
    assert stats["num_draft_tokens"] > 0 and stats["num_accepted_tokens"] == stats["num_draft_tokens"]


def test_random_sampling_runs_and_greedy_rows_beside_it_keep_their_tokens(target, shallow_draft):
    prompts = random_prompts(4, seed=30)
    params = [GREEDY, SamplingParams(temperature=0.8, top_k=20, max_tokens=30, ignore_eos=True, seed=3)] * 2
    expected = generate_tokens(LLM(model=str(target), skip_tokenizer_init=True), prompts, params)
    llm = LLM(model=str(target), skip_tokenizer_init=True, speculative_config=_draft(shallow_draft))
    got = generate_tokens(llm, prompts, params)
    assert got[0] == expected[0] and got[2] == expected[2]
    assert all(len(tokens) == 30 for tokens in got)
    again = generate_tokens(LLM(model=str(target), skip_tokenizer_init=True, speculative_config=_draft(shallow_draft)),
                      prompts, params)
    assert again == got  # seeded: the same draws again


def test_the_scheduler_holds_slots_for_the_drafts_writes():
    """num_lookahead_tokens: a chunk's blocks reach num_speculative_tokens past it (the draft writes the sampled
    token's KV and its drafts' before the next step schedules them)."""
    def blocks_after_prefill(lookahead):
        scheduler = Scheduler(SchedulerConfig(max_model_len=256, num_speculative_tokens=3,
                                              num_lookahead_tokens=lookahead),
                              CacheConfig(block_size=16, num_gpu_blocks=64))
        scheduler.add_request(Request("r", list(range(4, 36)), CoreSamplingParams(max_tokens=8)))
        scheduler.schedule()
        return len(scheduler.kv_cache_manager.req_to_blocks["r"])

    assert (blocks_after_prefill(0), blocks_after_prefill(3)) == (2, 3)  # 32 tokens; 35 slots need a third block
    with pytest.raises(ValueError, match="num_lookahead_tokens must be an integer in \\[0, num_speculative_tokens=3\\]"):
        SchedulerConfig(num_speculative_tokens=3, num_lookahead_tokens=4)
    assert SpeculativeConfig.parse({"model": "tiny", "num_speculative_tokens": 2}).num_lookahead_tokens == 2
    assert SpeculativeConfig.parse({"num_speculative_tokens": 2}).num_lookahead_tokens == 0  # n-gram writes none


def test_a_layer_skip_draft_keeps_the_first_layers(target, tmp_path):
    from safetensors.torch import load_file

    draft = write_layer_skip_draft(target, tmp_path / "draft", 2)
    tensors, original = load_file(draft / "model.safetensors"), load_file(target / "model.safetensors")
    assert set(tensors) == {name for name in original if ".layers.2." not in name}
    assert all(tensors[name].equal(original[name]) for name in tensors)
    with pytest.raises(ValueError, match="num_layers must be in \\[1, 3\\]"):
        write_layer_skip_draft(target, tmp_path / "bad", 4)


def test_bad_draft_models_are_refused_by_key(target, tmp_path):
    other_vocabulary = make_test_model(tmp_path / "other", "llama", vocab_size=256)
    with pytest.raises(ValueError, match="speculative_config.model .* has vocab_size 256, the target 512"):
        LLM(model=str(target), skip_tokenizer_init=True, speculative_config=_draft(other_vocabulary))
    with pytest.raises(ValueError, match="speculative_config.model must be one of .* got '/no/such/folder'"):
        LLM(model=str(target), skip_tokenizer_init=True, speculative_config=_draft("/no/such/folder"))
    with pytest.raises(ValueError, match="speculative_config.model must be the checkpoint of a draft model or EAGLE "
                                         "head for methods draft_model, eagle and eagle3"):
        SpeculativeConfig.parse({"method": "draft_model", "num_speculative_tokens": 2})
    windowed = make_test_model(tmp_path / "windowed", "mistral", config_overrides={"sliding_window": 8})
    with pytest.raises(ValueError, match="attends further back than the target's sliding_window 8"):
        LLM(model=str(windowed), skip_tokenizer_init=True, speculative_config=_draft(target))
    with pytest.raises(ValueError, match="does not run with kv_offloading_size_gib"):
        LLM(model=str(target), skip_tokenizer_init=True, speculative_config=_draft(target), kv_offloading_size_gib=1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_drafts_keep_the_cpu_tokens(target, shallow_draft):
    """The draft's cache and forwards on the GPU beside CUDA-graph decodes (benchmarks/gpu_check.sh runs it)."""
    prompts = random_prompts(4)
    expected = generate_tokens(LLM(model=str(target), skip_tokenizer_init=True, device="cpu"), prompts, GREEDY)
    llm = LLM(model=str(target), skip_tokenizer_init=True, device="cuda", speculative_config=_draft(shallow_draft))
    assert generate_tokens(llm, prompts, GREEDY) == expected
    assert llm.engine_core.scheduler.make_stats().spec_decoding["num_drafts"] > 0
