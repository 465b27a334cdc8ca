"""OLMo 3 (``Olmo3ForCausalLM``) on a checkpoint transformers itself wrote, its RoPE keyed by layer kind as
transformers 5 writes it: YaRN on the full layers, plain RoPE at another base on the sliding ones (an 8-token window
on three layers of four). Logits and greedy tokens equal transformers'; the engine runs it on vLLM's hybrid KV
cache, the sliding groups handing blocks back. (The Hub's spelling, rope_theta with rope_scaling, is checked in
tests/models/test_models_vs_transformers.py's "olmo3" variant.)"""

from __future__ import annotations

import json

import pytest
import torch

from engine.models.config import ModelConfig
from tests.models.engine_generation import (assert_engine_generates_as_transformers, engine_and_transformers,
                                            random_prompt, save_random)
from tests.models.test_models_vs_transformers import ATOL, PagedSession, hf_logits

WINDOW = 8
ROPE = {"full_attention": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                           "rope_theta": 10000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0}}


def write_olmo3(path, **overrides):
    from transformers import Olmo3Config, Olmo3ForCausalLM

    config = Olmo3Config(**{**dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   sliding_window=WINDOW, rope_parameters=ROPE, bos_token_id=1, eos_token_id=2,
                                   pad_token_id=0), **overrides})
    return save_random(Olmo3ForCausalLM(config), path)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_olmo3(tmp_path_factory.mktemp("olmo3"))


_prompt = random_prompt


def test_the_config_reads_each_layer_kinds_rope_and_window(checkpoint):
    config = ModelConfig.from_pretrained(checkpoint)
    assert config.layer_sliding_windows == (WINDOW, WINDOW, WINDOW, None)
    assert config.rope_theta == 10000.0 and config.rope_scaling["rope_type"] == "yarn"
    assert config.local_rope_theta == 20000.0


def test_prefill_and_decodes_past_the_window_match_transformers(checkpoint):
    model, config, hf_model = engine_and_transformers(checkpoint)
    tokens = _prompt(1, 45)
    expected = hf_logits(hf_model, tokens)
    session = PagedSession(model, config, seed=2)
    torch.testing.assert_close(session.step({"r": tokens[:30]})["r"], expected[:30], atol=ATOL, rtol=0)
    for position in range(30, 45):
        torch.testing.assert_close(session.step({"r": [tokens[position]]})["r"], expected[position:position + 1],
                                   atol=ATOL, rtol=0)


def test_the_engine_generates_what_transformers_generates_on_the_hybrid_kv_cache(checkpoint):
    prompts = [_prompt(seed, 21) for seed in range(3)]
    llm = assert_engine_generates_as_transformers(checkpoint, prompts, max_tokens=10, max_num_batched_tokens=16,
                                                  block_size=4, max_model_len=128)
    assert llm.scheduler.cache_config.kv_cache_groups == (None, WINDOW, WINDOW, WINDOW)  # groups of one layer
    manager = llm.scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks


def test_the_sliding_layers_must_turn_unscaled(tmp_path):
    path = write_olmo3(tmp_path / "olmo3")
    config = json.loads((path / "config.json").read_text())
    config["rope_parameters"]["sliding_attention"] = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="OLMo 3's sliding_attention RoPE must be the default type"):
        ModelConfig.from_pretrained(path)
