"""LLaVA-OneVision images in the real engine, on a checkpoint transformers writes: a SigLIP tower (every patch kept)
over LLaVA-NeXT's tiles, the unpadded map shrunk bilinearly past "anyres_max_N", equal to transformers'; an image
shown with others is its base tile and a newline, as transformers packs it; prompt logprobs within 1e-4 and greedy
tokens through chunks; a real run replays exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from engine import LLM, SamplingParams
from tests.models.engine_generation import save_random
from tests.models.image_references import greedy_by_forward, picture, prompt_logprob_error
from tests.models.test_multimodal_text import TEXT

IMAGE = 500
PINPOINTS = [[28, 28], [28, 56], [56, 28], [56, 56], [28, 84], [84, 28], [84, 84], [56, 84], [84, 56]]
TEXT_IDS = [token for token in range(TEXT["vocab_size"]) if token != IMAGE]


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, allowed_token_ids=TEXT_IDS)


@pytest.fixture(scope="module")
def onevision(tmp_path_factory):
    from transformers import LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration

    from engine.models.synthetic_tokenizer import train_tokenizer

    path = tmp_path_factory.mktemp("llava-onevision")
    # At most two tiles' worth of grid features: a 3 x 3 grid's map is shrunk.
    config = LlavaOnevisionConfig(text_config={**TEXT, "model_type": "qwen2"}, image_token_index=IMAGE,
                                  image_grid_pinpoints=PINPOINTS, vision_aspect_ratio="anyres_max_2",
                                  vision_config=dict(model_type="siglip_vision_model", hidden_size=32,
                                                     intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                                     image_size=28, patch_size=14))
    save_random(LlavaOnevisionForConditionalGeneration(config), path)
    tokenizer = train_tokenizer(IMAGE, 256)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    tokenizer.save_pretrained(str(path))
    (path / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "LlavaOnevisionImageProcessor", "image_grid_pinpoints": PINPOINTS,
        "size": {"height": 28, "width": 28}, "do_resize": True, "do_rescale": True, "do_normalize": True,
        "do_pad": True, "do_convert_rgb": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "resample": 3, "rescale_factor": 1 / 255}))
    return path


@pytest.fixture(scope="module")
def hf(onevision):
    from transformers import AutoImageProcessor, LlavaOnevisionForConditionalGeneration

    model = LlavaOnevisionForConditionalGeneration.from_pretrained(str(onevision), dtype=torch.float32,
                                                                   attn_implementation="eager").eval()
    return model, AutoImageProcessor.from_pretrained(str(onevision))


def hf_logits(hf, ids: list[int], images: list[np.ndarray]) -> torch.Tensor:
    """transformers' logits, the prompt's images processed as one prompt's (as its processor groups them)."""
    model, processor = hf
    pixels = {}
    if images:
        processed = processor(images=[images], return_tensors="pt")
        pixels = {key: processed[key] for key in ("pixel_values", "image_sizes", "batch_num_images")}
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), **pixels).logits[0]


def test_tiles_shrunk_past_the_cap_equal_transformers(onevision, hf):
    from engine.models.vision import load_image_encoder

    model, processor = hf
    images = [picture(0, 40, 90), picture(1, 80, 80), picture(2, 70, 30)]
    processed = processor(images=images, return_tensors="pt")  # each alone
    encoder = load_image_encoder(onevision, torch.float32, torch.device("cpu"))
    items = encoder.split_processed(processed)
    assert [tokens for _, tokens in items] == [9, 10, 12]  # the square one's 6 x 6 map shrunk to 2 x 2
    with torch.no_grad():
        expected = model.model.get_image_features(processed["pixel_values"], processed["image_sizes"],
                                                  vision_feature_layer=-1,
                                                  vision_feature_select_strategy="full").pooler_output
        for ours, theirs in zip(encoder.encode([data for data, _ in items]), expected):
            torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("images", [[picture(3, 80, 80)], [picture(4, 40, 90), picture(5, 70, 30)]],
                         ids=["alone", "two"])
def test_logprobs_and_tokens_equal_transformers_for_an_image_alone_or_with_another(onevision, hf, images):
    llm = LLM(model=str(onevision), dtype="float32", max_num_batched_tokens=8, block_size=4)
    prompt = [1, 5] + [token for _ in images for token in (IMAGE, 7)]
    output = llm.generate([{"prompt_token_ids": prompt, "multi_modal_data": {"image": images}}],
                          SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0), use_tqdm=False)[0]
    # Alone: the base tile's 4 and the shrunk map's 2 x (2 + 1); with another: each its base tile's 4 and a newline.
    assert len(output.prompt_token_ids) == len(prompt) - len(images) + 10
    assert prompt_logprob_error(output, hf_logits(hf, output.prompt_token_ids, images)) < 1e-4
    tokens = llm.generate([{"prompt_token_ids": prompt, "multi_modal_data": {"image": images}}], greedy(8),
                          use_tqdm=False)[0]
    assert list(tokens.outputs[0].token_ids) == greedy_by_forward(lambda ids: hf_logits(hf, ids, images),
                                                                  tokens.prompt_token_ids, TEXT_IDS, 8)


def test_a_real_run_replays_exactly(onevision, tmp_path):
    from analysis import read_run
    from tests.models.image_real_runs import image_workload, record
    from tests.sim.test_sliding_window_real_run import assert_replays_exactly

    record(image_workload("onevision-images", 3, {"type": "choice", "values": [9, 10, 12]}), onevision,
           tmp_path / "real")
    run = read_run(tmp_path / "real")
    assert run.summary["num_finished"] == 10 and set(run.requests["num_image_tokens"]) - {0} <= {9, 10, 12}
    assert_replays_exactly(tmp_path / "real")
