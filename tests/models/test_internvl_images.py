"""InternVL images in the real engine (transformers' ``InternVLForConditionalGeneration``, the Hub's "-hf"
checkpoints), on a checkpoint transformers writes: InternViT over each image's tiles (a grid of the image's aspect
ratio and a thumbnail), the pixel shuffle and the projector equal transformers'; an image token becomes ``<img>``,
the image's tokens (as many as its tiles give) and ``</img>``; prompt logprobs within 1e-4 and greedy tokens equal
transformers' through chunked prefill across images of different shapes, a prefix hit past an image and preemption;
a real run draws each image at a shape of its token count and replays exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from engine import LLM, SamplingParams
from tests.models.engine_generation import save_random
from tests.models.image_references import greedy_by_forward, picture, prompt_logprob_error
from tests.models.test_multimodal_text import TEXT

IMAGE, START, END = 500, 501, 502
PER_TILE = 4  # 56-pixel tiles: 4 x 4 patches of 14, shuffled 2 x 2
TEXT_IDS = [token for token in range(TEXT["vocab_size"]) if token not in (IMAGE, START, END)]


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, allowed_token_ids=TEXT_IDS)


@pytest.fixture(scope="module")
def internvl(tmp_path_factory):
    from transformers import InternVLConfig, InternVLForConditionalGeneration

    from engine.models.synthetic_tokenizer import train_tokenizer

    path = tmp_path_factory.mktemp("internvl")
    # q/k norms and layer scales on (InternVL3's 1B-38B towers differ in both); a Qwen2 language model.
    config = InternVLConfig(text_config={**TEXT, "model_type": "qwen2"}, image_token_id=IMAGE, downsample_ratio=0.5,
                            image_seq_length=PER_TILE,
                            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                               num_attention_heads=2, image_size=[56, 56], patch_size=[14, 14],
                                               use_qk_norm=True, attention_bias=True, layer_scale_init_value=0.5))
    save_random(InternVLForConditionalGeneration(config), path)
    tokenizer = train_tokenizer(IMAGE, 256)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<IMG_CONTEXT>", "<img>", "</img>"]})
    tokenizer.save_pretrained(str(path))
    (path / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "GotOcr2ImageProcessor", "crop_to_patches": True, "min_patches": 1,
        "max_patches": 6, "size": {"height": 56, "width": 56}, "image_mean": [0.485, 0.456, 0.406],
        "image_std": [0.229, 0.224, 0.225], "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "do_resize": True, "resample": 3, "do_convert_rgb": True}))
    return path


@pytest.fixture(scope="module")
def hf(internvl):
    from transformers import AutoImageProcessor, InternVLForConditionalGeneration

    model = InternVLForConditionalGeneration.from_pretrained(str(internvl), dtype=torch.float32,
                                                             attn_implementation="eager").eval()
    return model, AutoImageProcessor.from_pretrained(str(internvl))


def hf_logits(hf, ids: list[int], images: list[np.ndarray]) -> torch.Tensor:
    model, processor = hf
    pixels = {"pixel_values": processor(images=images, return_tensors="pt")["pixel_values"]} if images else {}
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), **pixels).logits[0]


def hf_tokens(hf, prompt_ids: list[int], images: list[np.ndarray], max_tokens: int = 8) -> list[int]:
    return greedy_by_forward(lambda ids: hf_logits(hf, ids, images), prompt_ids, TEXT_IDS, max_tokens)


def test_the_tower_shuffle_and_projector_equal_transformers(internvl, hf):
    from engine.models.vision import load_image_encoder

    model, processor = hf
    # 2 x 3 tiles and a thumbnail; one tile.
    processed = processor(images=[picture(0, 112, 168), picture(1, 50, 60)], return_tensors="pt")
    encoder = load_image_encoder(internvl, torch.float32, torch.device("cpu"))
    items = encoder.split_processed(processed)
    assert [tokens for _, tokens in items] == [7 * PER_TILE, PER_TILE]
    with torch.no_grad():
        expected = model.model.get_image_features(processed["pixel_values"], vision_feature_layer=-1,
                                                  vision_feature_select_strategy="default").pooler_output
        ours = torch.cat(encoder.encode([data for data, _ in items]))
    torch.testing.assert_close(ours, expected.reshape(ours.shape), atol=1e-5, rtol=0)


def test_a_mark_becomes_the_span_and_prompt_logprobs_equal_transformers(internvl, hf):
    llm = LLM(model=str(internvl), dtype="float32", max_num_batched_tokens=16, block_size=4)
    image = picture(2, 56, 168)
    prompt = [1, 5, 6, IMAGE, 7, 8, 9]
    output = llm.generate([{"prompt_token_ids": prompt, "multi_modal_data": {"image": image}}],
                          SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0), use_tqdm=False)[0]
    ids = output.prompt_token_ids
    assert ids == [1, 5, 6, START] + [IMAGE] * 4 * PER_TILE + [END, 7, 8, 9]  # 1 x 3 tiles and a thumbnail
    assert prompt_logprob_error(output, hf_logits(hf, ids, [image])) < 1e-4
    # Already expanded (as transformers' processor writes the prompt): taken as it is.
    again = llm.generate([{"prompt_token_ids": ids, "multi_modal_data": {"image": image}}], greedy(1),
                         use_tqdm=False)[0]
    assert again.prompt_token_ids == ids


def test_images_of_two_shapes_across_chunks_a_prefix_hit_and_preemption_keep_transformers_tokens(internvl, hf):
    llm = LLM(model=str(internvl), dtype="float32", max_num_batched_tokens=12, block_size=4)
    images = [picture(3, 112, 112), picture(4, 40, 40)]  # 2 x 2 tiles and a thumbnail; one tile
    prompt = [1, 5, IMAGE, 7, IMAGE, 9]
    outputs = llm.generate([{"prompt_token_ids": prompt, "multi_modal_data": {"image": images}}, [1, 20, 21]],
                           greedy(8), use_tqdm=False)
    assert list(outputs[0].outputs[0].token_ids) == hf_tokens(hf, outputs[0].prompt_token_ids, images)
    assert list(outputs[1].outputs[0].token_ids) == hf_tokens(hf, [1, 20, 21], [])
    again = llm.generate([{"prompt_token_ids": prompt, "multi_modal_data": {"image": images}}], greedy(8),
                         use_tqdm=False)[0]
    assert again.num_cached_tokens > 20 and again.outputs[0].token_ids == outputs[0].outputs[0].token_ids

    small = LLM(model=str(internvl), dtype="float32", block_size=4, num_gpu_blocks=24, max_num_batched_tokens=32,
                enable_prefix_caching=False)
    prompts = [([1, 30 + seed, IMAGE, 40 + seed], picture(10 + seed, 56, 56 * (1 + seed % 2))) for seed in range(4)]
    outputs = small.generate([{"prompt_token_ids": p, "multi_modal_data": {"image": image}} for p, image in prompts],
                             greedy(20), use_tqdm=False)
    assert small.scheduler.num_preemptions_total > 0
    for (_, image), output in zip(prompts, outputs):
        assert list(output.outputs[0].token_ids) == hf_tokens(hf, output.prompt_token_ids, [image], max_tokens=20)


def test_without_the_tokenizer_images_are_refused_by_name(internvl):
    llm = LLM(model=str(internvl), dtype="float32", skip_tokenizer_init=True)
    with pytest.raises(ValueError, match=r"prompt 0: .*InternVL images need the checkpoint's tokenizer"):
        llm.generate([{"prompt_token_ids": [1, IMAGE, 5], "multi_modal_data": {"image": picture(0, 56, 56)}}],
                     greedy(2), use_tqdm=False)
    assert len(llm.generate([[1, 5, 6]], greedy(3), use_tqdm=False)[0].outputs[0].token_ids) == 3


def test_a_real_run_draws_each_image_at_its_shape_and_replays_exactly(internvl, tmp_path):
    """A workload's images of one tile or three tiles and a thumbnail (4 or 16 tokens), recorded on the real engine
    (each picture drawn as a grid of tiles of that count) and replayed by the simulator, which reads the checkpoint's
    InternViT; counts no grid gives are refused by name."""
    from analysis import read_run
    from sim.real_engine import build_real_engine
    from sim.vision_setup import VisionSetupError
    from tests.models.image_real_runs import image_workload, record
    from tests.sim.test_sliding_window_real_run import assert_replays_exactly

    tokens = {"type": "choice", "values": [PER_TILE, 4 * PER_TILE]}
    record(image_workload("internvl-images", 5, tokens), internvl, tmp_path / "real")
    run = read_run(tmp_path / "real")
    assert run.summary["num_finished"] == 10 and int(run.steps["num_encoder_items"].sum()) > 0
    assert set(run.requests["num_image_tokens"]) - {0} == {PER_TILE, 4 * PER_TILE}  # one image a request
    assert_replays_exactly(tmp_path / "real")
    with pytest.raises(VisionSetupError, match=r"the real model makes no image of 8 tokens"):
        record(image_workload("internvl-images", 5, {"type": "constant", "value": 2 * PER_TILE}), internvl,
               tmp_path / "refused")
    with pytest.raises(VisionSetupError, match=r"at most 28"):
        build_real_engine(image_workload("internvl-images", 5, {"type": "constant", "value": 100}),
                          model=str(internvl), threads=1)
