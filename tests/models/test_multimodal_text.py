"""Multimodal checkpoints served as their language model (text in, text out): Gemma 3 4B-27B's, Mistral Small 3.1+'s,
LLaVA's and Qwen2.5-VL's layouts (M-RoPE, plain RoPE for text), written by transformers itself, give transformers' text-only logits and greedy tokens; their
vision towers and projectors are not loaded, and an unsupported language model is named."""

from __future__ import annotations

import json
import random

import pytest
import torch

from engine.models import load_model
from engine.models.config import ModelConfig
from engine.models.registry import get_model_class
from tests.models.engine_generation import assert_engine_generates_as_transformers, save_random
from tests.models.test_models_vs_transformers import ATOL, PagedSession, hf_logits

TEXT = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=256)


def _gemma3(path):
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    config = Gemma3Config(text_config={**TEXT, "sliding_window": 8}, mm_tokens_per_image=4, image_token_index=500,
                          vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=2, image_size=28, patch_size=14))
    return save_random(Gemma3ForConditionalGeneration(config), path)


def _mistral3(path):
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    config = Mistral3Config(text_config={**TEXT, "model_type": "mistral", "sliding_window": None},
                            vision_config=dict(model_type="pixtral", hidden_size=32, intermediate_size=64,
                                               num_hidden_layers=1, num_attention_heads=2, image_size=28,
                                               patch_size=14, head_dim=16), image_token_index=500)
    return save_random(Mistral3ForConditionalGeneration(config), path)


def _llava(path):
    from transformers import LlavaConfig, LlavaForConditionalGeneration

    config = LlavaConfig(text_config={**TEXT, "model_type": "llama"}, image_token_index=500,
                         vision_config=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64,
                                            num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14,
                                            projection_dim=32))
    return save_random(LlavaForConditionalGeneration(config), path)


def _qwen2_5_vl(path):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    rope = {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0}
    config = Qwen2_5_VLConfig(text_config={**TEXT, "rope_parameters": rope, "eos_token_id": 2},
                              vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                                                 out_hidden_size=64, patch_size=14, spatial_merge_size=2,
                                                 fullatt_block_indexes=[0]),
                              image_token_id=500, video_token_id=501, vision_start_token_id=502)
    return save_random(Qwen2_5_VLForConditionalGeneration(config), path)


def _qwen2_5_vl_published(path):
    """The Hub's layout: the language model's keys at the top level and ``rope_scaling`` type mrope."""
    _qwen2_5_vl(path)
    config = json.loads((path / "config.json").read_text())
    text = config.pop("text_config")
    rope = text.pop("rope_parameters")
    config.update(text, rope_theta=rope["rope_theta"],
                  rope_scaling={"type": "mrope", "mrope_section": rope["mrope_section"]})
    (path / "config.json").write_text(json.dumps(config))
    return path


def _qwen3_vl(path):
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    rope = {"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True, "rope_theta": 10000.0}
    config = Qwen3VLConfig(text_config={**TEXT, "rope_parameters": rope}, image_token_id=500, video_token_id=501,
                           vision_start_token_id=502,
                           vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                                              out_hidden_size=64, patch_size=14, spatial_merge_size=2,
                                              deepstack_visual_indexes=[0]))
    return save_random(Qwen3VLForConditionalGeneration(config), path)


WRITERS = {"gemma3": _gemma3, "mistral3": _mistral3, "llava": _llava, "qwen2_5_vl": _qwen2_5_vl, "qwen3_vl": _qwen3_vl}


@pytest.fixture(scope="module", params=list(WRITERS))
def checkpoint(request, tmp_path_factory):
    return WRITERS[request.param](tmp_path_factory.mktemp(request.param))


def _prompt(seed, length):
    rng = random.Random(seed)
    return [rng.randrange(4, 400) for _ in range(length)]


def test_logits_equal_transformers_text_only(checkpoint):
    from transformers import AutoModelForImageTextToText

    model, config = load_model(checkpoint, torch.float32)
    assert not model.unexpected_weights  # the vision tower and projector are left out, not reported as strays
    hf_model = AutoModelForImageTextToText.from_pretrained(str(checkpoint), dtype=torch.float32,
                                                           attn_implementation="eager").eval()
    prompts = {f"r{n}": _prompt(n, n) for n in (3, 17, 30)}
    logits = PagedSession(model, config).step(prompts)
    for name, tokens in prompts.items():
        torch.testing.assert_close(logits[name], hf_logits(hf_model, tokens), atol=ATOL, rtol=0, msg=name)


def test_the_published_qwen_vl_layout_is_the_same_model(tmp_path):
    """Top-level keys and rope_scaling type mrope (the Hub's Qwen2.5-VL configs) load as transformers 5's layout
    does, whose logits equal transformers' (above)."""
    written = load_model(_qwen2_5_vl(tmp_path / "written"), torch.float32)
    published = load_model(_qwen2_5_vl_published(tmp_path / "published"), torch.float32)
    assert published[1].rope_scaling is None and published[1].attention_bias
    prompts = {f"r{n}": _prompt(n, n) for n in (5, 30)}
    expected = PagedSession(*written).step(prompts)
    for name, logits in PagedSession(*published).step(prompts).items():
        torch.testing.assert_close(logits, expected[name], rtol=0, atol=0)


def test_the_engine_generates_what_transformers_generates(tmp_path):
    """Gemma 3's windowed layers on the hybrid KV cache, through the scheduler with chunked prefill."""
    path = _gemma3(tmp_path / "gemma3")
    assert_engine_generates_as_transformers(path, [_prompt(seed, 20) for seed in range(3)], max_model_len=64,
                                            max_num_batched_tokens=16)


def test_an_unsupported_language_model_is_named(tmp_path):
    config = {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava",
              "text_config": {**TEXT, "model_type": "phi3"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="LlavaForConditionalGeneration's language model \\(text_config.model_type "
                                         "'phi3'\\) is not supported"):
        get_model_class(ModelConfig.from_pretrained(tmp_path))
    with pytest.raises(ValueError, match="needs its language model's keys in text_config"):
        ModelConfig.from_dict({"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3"})
