"""LLaVA-NeXT (LLaVA-1.6) images in the real engine, on a checkpoint transformers writes: the tiles of an image's best
pinpoint resolution and its base tile through LLaVA's CLIP and projector, laid out as one feature map, unpadded and
ended row by row with the learned newline, equal transformers' for wide, square and tall images; prompt logprobs
within 1e-4 and greedy tokens through chunked prefill, a prefix hit and preemption; a real run draws pictures of the
workload's token counts and replays exactly."""

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
PINPOINTS = [[28, 56], [56, 28], [56, 56], [28, 84], [84, 28]]  # in 28-pixel tiles of 2 x 2 patches
TEXT_IDS = [token for token in range(TEXT["vocab_size"]) if token != IMAGE]


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, allowed_token_ids=TEXT_IDS)


@pytest.fixture(scope="module")
def llava_next(tmp_path_factory):
    from transformers import LlavaNextConfig, LlavaNextForConditionalGeneration

    from engine.models.synthetic_tokenizer import train_tokenizer

    path = tmp_path_factory.mktemp("llava-next")
    config = LlavaNextConfig(text_config={**TEXT, "model_type": "llama"}, image_token_index=IMAGE,
                             image_grid_pinpoints=PINPOINTS,
                             vision_config=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64,
                                                num_hidden_layers=2, num_attention_heads=2, image_size=28,
                                                patch_size=14, projection_dim=32))
    save_random(LlavaNextForConditionalGeneration(config), path)
    tokenizer = train_tokenizer(IMAGE, 256)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    tokenizer.save_pretrained(str(path))
    (path / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "LlavaNextImageProcessor", "image_grid_pinpoints": PINPOINTS,
        "size": {"shortest_edge": 28}, "crop_size": {"height": 28, "width": 28}, "do_center_crop": True,
        "do_resize": True, "do_rescale": True, "do_normalize": True, "do_pad": True, "do_convert_rgb": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
        "resample": 3, "rescale_factor": 1 / 255}))
    return path


@pytest.fixture(scope="module")
def hf(llava_next):
    from transformers import AutoImageProcessor, LlavaNextForConditionalGeneration

    model = LlavaNextForConditionalGeneration.from_pretrained(str(llava_next), dtype=torch.float32,
                                                              attn_implementation="eager").eval()
    return model, AutoImageProcessor.from_pretrained(str(llava_next))


def hf_logits(hf, ids: list[int], images: list[np.ndarray]) -> torch.Tensor:
    model, processor = hf
    pixels = {}
    if images:
        processed = processor(images=images, return_tensors="pt")
        pixels = {"pixel_values": processed["pixel_values"], "image_sizes": processed["image_sizes"]}
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), **pixels).logits[0]


def hf_tokens(hf, prompt_ids: list[int], images: list[np.ndarray], max_tokens: int = 8) -> list[int]:
    return greedy_by_forward(lambda ids: hf_logits(hf, ids, images), prompt_ids, TEXT_IDS, max_tokens)


def test_tiles_unpadded_with_newlines_equal_transformers(llava_next, hf):
    from engine.models.vision import load_image_encoder

    model, processor = hf
    images = [picture(0, 40, 90), picture(1, 50, 50), picture(2, 70, 30)]
    processed = processor(images=images, return_tensors="pt")
    encoder = load_image_encoder(llava_next, torch.float32, torch.device("cpu"))
    items = encoder.split_processed(processed)
    assert [tokens for _, tokens in items] == [14, 24, 16]  # base 4, then the unpadded rows with their newlines
    with torch.no_grad():
        expected = model.model.get_image_features(processed["pixel_values"], processed["image_sizes"],
                                                  vision_feature_layer=-2,
                                                  vision_feature_select_strategy="default").pooler_output
        for ours, theirs in zip(encoder.encode([data for data, _ in items]), expected):
            torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)


def test_logprobs_and_tokens_through_chunks_a_prefix_hit_and_preemption(llava_next, hf):
    llm = LLM(model=str(llava_next), skip_tokenizer_init=True, dtype="float32", max_num_batched_tokens=8,
              block_size=4)
    images = [picture(3, 40, 90), picture(4, 70, 30)]
    prompt = [1, 5, IMAGE, 7, IMAGE, 9]
    output = llm.generate([{"prompt_token_ids": prompt, "multi_modal_data": {"image": images}}],
                          SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0), use_tqdm=False)[0]
    assert len(output.prompt_token_ids) == len(prompt) - 2 + 14 + 16
    assert prompt_logprob_error(output, hf_logits(hf, output.prompt_token_ids, images)) < 1e-4
    first = llm.generate([{"prompt_token_ids": prompt, "multi_modal_data": {"image": images}}, [1, 20, 21]],
                         greedy(8), use_tqdm=False)
    assert first[0].num_cached_tokens > 20  # the same images after the same prefix
    assert list(first[0].outputs[0].token_ids) == hf_tokens(hf, first[0].prompt_token_ids, images)
    assert list(first[1].outputs[0].token_ids) == hf_tokens(hf, [1, 20, 21], [])

    small = LLM(model=str(llava_next), skip_tokenizer_init=True, dtype="float32", block_size=4, num_gpu_blocks=16,
                max_num_batched_tokens=32, enable_prefix_caching=False)
    prompts = [([1, 30 + seed, IMAGE, 40 + seed], picture(10 + seed, 30 + 20 * seed, 60)) for seed in range(4)]
    outputs = small.generate([{"prompt_token_ids": p, "multi_modal_data": {"image": image}} for p, image in prompts],
                             greedy(20), use_tqdm=False)
    assert small.scheduler.num_preemptions_total > 0
    for (_, image), output in zip(prompts, outputs):
        assert list(output.outputs[0].token_ids) == hf_tokens(hf, output.prompt_token_ids, [image], max_tokens=20)


def test_a_real_run_draws_each_image_at_its_token_count_and_replays_exactly(llava_next, tmp_path):
    from analysis import read_run
    from tests.models.image_real_runs import image_workload, record
    from tests.sim.test_sliding_window_real_run import assert_replays_exactly

    record(image_workload("llava-next-images", 3, {"type": "choice", "values": [14, 16, 24]}), llava_next,
           tmp_path / "real")
    run = read_run(tmp_path / "real")
    assert run.summary["num_finished"] == 10 and set(run.requests["num_image_tokens"]) - {0} <= {14, 16, 24}
    assert_replays_exactly(tmp_path / "real")
