"""LongRoPE (Phi-3-128k, Phi-3.5-mini, Phi-4-mini): logits and greedy tokens equal transformers' on the same
checkpoint with the short factors (an engine whose max_model_len stays within the pretraining context) and with
the long ones (beyond it), and the config's errors name the key."""

import random

import pytest
import torch

from engine.models import make_test_model
from engine.models.config import ModelConfig
from engine.models.phi3 import Phi3ForCausalLM
from tests.models.engine_generation import (assert_engine_generates_as_transformers, engine_and_transformers,
                                            random_prompt)
from tests.models.test_models_vs_transformers import ATOL, PagedSession, hf_logits

ORIGINAL_CONTEXT = 16  # the "pretraining" context of the test checkpoint: 4,096 in the real ones
BASE = {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "vocab_size": 100, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 64,
        "original_max_position_embeddings": ORIGINAL_CONTEXT}


def _factors(seed, count, low, high):
    rng = random.Random(seed)
    return [round(rng.uniform(low, high), 3) for _ in range(count)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """Phi-4-mini's layout: RoPE on three quarters of each head (6 pairs of 16 features), short factors near 1 and
    long ones far from it, so that the wrong set moves the logits."""
    return make_test_model(tmp_path_factory.mktemp("longrope"), "phi3", seed=3, config_overrides={
        "partial_rotary_factor": 0.75, "max_position_embeddings": 64,
        "original_max_position_embeddings": ORIGINAL_CONTEXT,
        "rope_scaling": {"type": "longrope", "short_factor": _factors(0, 6, 1.0, 1.3),
                         "long_factor": _factors(1, 6, 2.0, 8.0)}})


@pytest.fixture(scope="module")
def models(checkpoint):
    return engine_and_transformers(checkpoint)


_prompt = random_prompt


@pytest.mark.parametrize("max_model_len, lengths", [(ORIGINAL_CONTEXT, (3, 9, 16)), (64, (17, 30, 45))])
def test_logits_equal_transformers_with_the_factors_the_context_chooses(models, max_model_len, lengths):
    """transformers takes the long factors for a forward that reaches past the original context and the short
    ones otherwise; an engine takes them by max_model_len, so each case is a batch of prompts that fit it."""
    model, config, hf_model = models
    model.fit_context(max_model_len)
    prompts = {f"r{length}": _prompt(length, length) for length in lengths}
    logits = PagedSession(model, config, seed=1).step(prompts)
    for name, tokens in prompts.items():
        torch.testing.assert_close(logits[name], hf_logits(hf_model, tokens), atol=ATOL, rtol=0, msg=name)


def test_the_factors_matter(models):
    """Against a test that passes with either set: a 45-token prompt under the short factors is another model."""
    model, config, hf_model = models
    model.fit_context(ORIGINAL_CONTEXT)
    tokens = _prompt(45, 45)
    gap = (PagedSession(model, config).step({"r": tokens})["r"] - hf_logits(hf_model, tokens)).abs().max()
    model.fit_context(64)
    assert gap > 20 * ATOL


def test_chunked_prefill_and_decodes_keep_the_long_factors(models):
    model, config, hf_model = models
    model.fit_context(64)
    tokens = _prompt(7, 40)
    expected = hf_logits(hf_model, tokens)
    session = PagedSession(model, config, seed=2)
    got = [session.step({"r": tokens[:13]})["r"], session.step({"r": tokens[13:34]})["r"]]
    got += [session.step({"r": [token]})["r"] for token in tokens[34:]]
    torch.testing.assert_close(torch.cat(got), expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("max_model_len, prompt_length", [(ORIGINAL_CONTEXT, 8), (64, 30)])
def test_the_engine_generates_what_transformers_generates(checkpoint, max_model_len, prompt_length):
    """Through the scheduler with chunked prefill: 8 + 8 tokens stay within the original context (short factors on
    both sides); 30 + 8 lie beyond it (long factors on both sides)."""
    token_prompts = [_prompt(seed, prompt_length) for seed in range(3)]
    llm = assert_engine_generates_as_transformers(checkpoint, token_prompts, max_num_batched_tokens=16,
                                                  max_model_len=max_model_len)
    manager = llm.scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks


def test_config_reads_both_spellings_and_the_attention_factor():
    scaling = {"short_factor": [1.0] * 8, "long_factor": [2.0] * 8}
    old = ModelConfig.from_dict({**BASE, "rope_scaling": {"type": "su", **scaling}})  # the first Phi-3-128k name
    new = ModelConfig.from_dict({**BASE, "original_max_position_embeddings": None,
                                 "rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4,
                                                     "original_max_position_embeddings": ORIGINAL_CONTEXT, **scaling}})
    assert old.rope_scaling == new.rope_scaling
    # sqrt(1 + ln(64 / 16) / ln(16)) = sqrt(1.5), transformers' default; a given factor or attention_factor wins.
    assert old.rope_scaling["attention_factor"] == pytest.approx(1.5 ** 0.5)
    factor = ModelConfig.from_dict({**BASE, "rope_scaling": {"type": "longrope", "factor": 2.0, **scaling}})
    assert factor.rope_scaling["attention_factor"] == pytest.approx((1 + 0.25) ** 0.5)
    given = ModelConfig.from_dict({**BASE, "rope_scaling": {"type": "longrope", "attention_factor": 1.1, **scaling}})
    assert given.rope_scaling["attention_factor"] == 1.1


@pytest.mark.parametrize("scaling, message", [
    ({"long_factor": [2.0] * 8}, "needs short_factor as a list of positive numbers, got None"),
    ({"short_factor": [1.0] * 8, "long_factor": [2.0, -1.0] + [2.0] * 6}, "needs long_factor as a list of positive"),
    ({"short_factor": [1.0] * 8, "long_factor": [2.0] * 8, "attention_factor": 0},
     "attention_factor must be a positive number, got 0"),
])
def test_bad_factors_are_refused_by_key(scaling, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_dict({**BASE, "rope_scaling": {"type": "longrope", **scaling}})


def test_factor_lists_of_the_wrong_length_are_refused_when_the_model_is_built():
    """One factor per turned pair: 16-feature heads turned at 0.75 need 6, not 8."""
    config = ModelConfig.from_dict({**BASE, "partial_rotary_factor": 0.75,
                                    "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 8,
                                                     "long_factor": [2.0] * 6}})
    with pytest.raises(ValueError, match="short_factor has 8 values; the model turns 12 features of each head, so it "
                                         "needs 6"):
        Phi3ForCausalLM(config)
