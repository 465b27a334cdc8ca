"""Speculative decoding with an EAGLE head (speculative_config={"method": "eagle", "model": PATH, ...}): a one-layer head
over the target's features (engine/models/eagle.py, engine/runner/spec_decode/eagle.py).

Greedy requests produce exactly the tokens of decoding one token per step, whatever the head proposes, through chunked
prefill, preemption and the prefix cache. A head whose features are the target's own ("copying") must draft the last
token at every step: the target's greedy token at a position is the argmax of its feature there, so any feature taken
from the wrong position, or a chain fed the wrong input, shows as a different draft.
"""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.models import make_test_model
from tests.engine.spec_decode_helpers import (ENGINE_VARIANTS, assert_greedy_tokens_unchanged, generate_tokens,
                                              random_prompts)
from engine.models.eagle import make_eagle_head
from engine.runner.spec_decode import SpeculativeConfig


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return make_test_model(tmp_path_factory.mktemp("target"), "llama", seed=1, num_hidden_layers=3)


@pytest.fixture(scope="module")
def random_head(target, tmp_path_factory):
    return make_eagle_head(target, tmp_path_factory.mktemp("eagle") / "head", seed=3)


@pytest.fixture(scope="module")
def copying_head(target, tmp_path_factory):
    return make_eagle_head(target, tmp_path_factory.mktemp("copying") / "head", copying=True)




def _eagle(path, k=3):
    return {"method": "eagle", "model": str(path), "num_speculative_tokens": k}


GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)


@pytest.mark.parametrize("engine_kwargs", ENGINE_VARIANTS)
def test_greedy_tokens_are_those_of_decoding_one_token_per_step(target, random_head, engine_kwargs):
    assert_greedy_tokens_unchanged(target, _eagle(random_head), engine_kwargs, GREEDY)


@pytest.mark.parametrize("engine_kwargs", [{}, {"max_num_batched_tokens": 7},
                                           {"num_gpu_blocks": 14, "max_num_seqs": 4}])
def test_a_copying_head_drafts_the_last_token_at_every_step(target, copying_head, engine_kwargs):
    llm = LLM(model=str(target), skip_tokenizer_init=True, speculative_config=_eagle(copying_head, 4), **engine_kwargs)
    core, scheduler = llm.engine_core, llm.scheduler
    prompts = random_prompts(6, seed=10)
    expected = generate_tokens(LLM(model=str(target), skip_tokenizer_init=True), prompts, GREEDY)
    for index, prompt in enumerate(prompts):
        llm._add_request(f"r{index}", llm._parse_prompts([prompt])[0], GREEDY)
    checked = 0
    while core.has_work():
        for request in list(scheduler.running):
            if request.spec_token_ids:  # proposed after the last step, verified in the next
                assert request.spec_token_ids == [request.all_token_ids[-1]] * len(request.spec_token_ids)
                checked += 1
        core.step()
    assert checked > 20
    stats = scheduler.make_stats().spec_decoding
    # The target repeats tokens now and then: those drafts are accepted, and the tokens stay the target's.
    assert 0 < stats["num_accepted_tokens"] < stats["num_draft_tokens"]
    again = LLM(model=str(target), skip_tokenizer_init=True, speculative_config=_eagle(copying_head, 4),
                **engine_kwargs)
    assert generate_tokens(again, prompts, GREEDY) == expected


def test_bad_heads_are_refused_by_key(target, tmp_path):
    with pytest.raises(ValueError, match="is not an EAGLE head: it has 3 layers"):
        LLM(model=str(target), skip_tokenizer_init=True, speculative_config=_eagle(target))
    wide = make_test_model(tmp_path / "wide", "llama", hidden_size=128, num_hidden_layers=1)
    with pytest.raises(ValueError, match="has hidden_size 128, the target 64"):
        LLM(model=str(target), skip_tokenizer_init=True, speculative_config=_eagle(wide))
    with pytest.raises(ValueError, match="for methods draft_model, eagle and eagle3"):
        SpeculativeConfig.parse({"method": "eagle", "num_speculative_tokens": 2})
    assert SpeculativeConfig.parse(_eagle("/some/head")).num_lookahead_tokens == 3


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_an_eagle_head_keeps_the_cpu_tokens(target, random_head):
    """The head's cache and forwards on the GPU beside CUDA-graph decodes, whose features it reads
    (benchmarks/gpu_check.sh runs it)."""
    prompts = random_prompts(4)
    expected = generate_tokens(LLM(model=str(target), skip_tokenizer_init=True, device="cpu"), prompts, GREEDY)
    llm = LLM(model=str(target), skip_tokenizer_init=True, device="cuda", speculative_config=_eagle(random_head))
    assert generate_tokens(llm, prompts, GREEDY) == expected
    assert llm.engine_core.scheduler.make_stats().spec_decoding["num_drafts"] > 0


@pytest.fixture(scope="module")
def deep_target(tmp_path_factory):
    """Six layers: an EAGLE-3 head reads the inputs of layers 2, 3 and 3 (2, L / 2, L - 3)."""
    return make_test_model(tmp_path_factory.mktemp("deep"), "llama", seed=4, num_hidden_layers=6)


@pytest.fixture(scope="module")
def eagle3_head(deep_target, tmp_path_factory):
    from engine.models.eagle3 import make_eagle3_head

    return make_eagle3_head(deep_target, tmp_path_factory.mktemp("eagle3") / "head", draft_vocab_size=200, seed=5)


@pytest.mark.parametrize("engine_kwargs", ENGINE_VARIANTS)
def test_an_eagle3_head_keeps_the_targets_tokens_and_drafts_in_its_vocabulary(deep_target, eagle3_head,
                                                                                engine_kwargs):
    prompts = random_prompts(5, seed=20)
    prompts.append(prompts[0][:20] + [5, 6])
    expected = generate_tokens(LLM(model=str(deep_target), skip_tokenizer_init=True, **engine_kwargs), prompts, GREEDY)
    llm = LLM(model=str(deep_target), skip_tokenizer_init=True, **engine_kwargs,
              speculative_config={"method": "eagle3", "model": str(eagle3_head), "num_speculative_tokens": 3})
    core, scheduler = llm.engine_core, llm.scheduler
    for index, prompt in enumerate(prompts):
        llm._add_request(f"r{index}", llm._parse_prompts([prompt])[0], GREEDY)
    drafted = []
    while core.has_work():
        drafted += [token for request in scheduler.running for token in request.spec_token_ids]
        core.step()
    # Draft id i is target id 2 i: every draft is an even id below 400.
    assert drafted and all(token % 2 == 0 and token < 400 for token in drafted)
    assert generate_tokens(LLM(model=str(deep_target), skip_tokenizer_init=True, **engine_kwargs, speculative_config={
        "method": "eagle3", "model": str(eagle3_head), "num_speculative_tokens": 3}), prompts, GREEDY) == expected
    manager = llm.scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks


def test_an_eagle3_head_reads_the_inputs_of_three_target_layers(deep_target, eagle3_head):
    """The target keeps the residual stream entering layers 2, 3 and 3 for the head, and only when one is loaded."""
    plain = LLM(model=str(deep_target), skip_tokenizer_init=True)
    assert plain.model_runner.model.model.aux_hidden_state_layers == ()
    llm = LLM(model=str(deep_target), skip_tokenizer_init=True,
              speculative_config={"method": "eagle3", "model": str(eagle3_head), "num_speculative_tokens": 2})
    target = llm.model_runner.model.model
    assert target.aux_hidden_state_layers == (2, 3, 3)
    generate_tokens(llm, random_prompts(1), SamplingParams(max_tokens=2, ignore_eos=True))
    assert len(target.aux_hidden_states) == 3 and target.aux_hidden_states[1] is target.aux_hidden_states[2]
    eagle1 = make_eagle_head(deep_target, eagle3_head.parent / "eagle1")
    with pytest.raises(ValueError, match="is not an EAGLE-3 head .* an EAGLE-1 head is method eagle"):
        LLM(model=str(deep_target), skip_tokenizer_init=True,
            speculative_config={"method": "eagle3", "model": str(eagle1), "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="cannot read this target's layers: it has 3 layers"):
        LLM(model=str(make_test_model(eagle3_head.parent / "shallow", "llama", num_hidden_layers=3)),
            skip_tokenizer_init=True,
            speculative_config={"method": "eagle3", "model": str(eagle3_head), "num_speculative_tokens": 2})


@pytest.mark.parametrize("family", ["gpt_oss", "qwen3"])
def test_heads_draft_for_other_families(tmp_path, family):
    """The published heads for gpt-oss and Qwen3 are plain Llama layers over the target's features: both kinds of head
    keep such targets' greedy tokens (gpt-oss: attention sinks and experts; Qwen3: q/k norms)."""
    from engine.models.eagle3 import make_eagle3_head

    target = make_test_model(tmp_path / "target", family, num_hidden_layers=4, seed=2)
    for method, head in (("eagle", make_eagle_head(target, tmp_path / "eagle")),
                         ("eagle3", make_eagle3_head(target, tmp_path / "eagle3", draft_vocab_size=200))):
        assert_greedy_tokens_unchanged(target, {"method": method, "model": str(head), "num_speculative_tokens": 3}, {})
