"""Images in the real engine: a LLaVA checkpoint that transformers writes (CLIP tower, projector, Llama), its
images preprocessed by the checkpoint's own image processor, give transformers' greedy tokens and prompt logprobs
(within 1e-4) through the shared scheduler: with images split across prefill chunks, a repeated image encoded
once, a prefix-cache hit past an image, two images behind the same tokens kept apart, and preemption. Bad image
input is refused by name and leaves the engine healthy."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from engine import LLM, SamplingParams
from tests.models.engine_generation import save_random
from tests.models.test_multimodal_text import TEXT

IMAGE_TOKEN = 500
# 56-pixel images in patches of 14: 16 patches; the default strategy drops the class token.
TOKENS_PER_IMAGE = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
PROCESSOR = {"crop_size": {"height": 56, "width": 56}, "do_center_crop": True, "do_convert_rgb": True,
             "do_normalize": True, "do_rescale": True, "do_resize": True,
             "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
             "image_processor_type": "CLIPImageProcessor", "resample": 3, "rescale_factor": 1 / 255,
             "size": {"shortest_edge": 56}}


def write_llava(path, image_token: int = IMAGE_TOKEN, **options):
    from transformers import LlavaConfig, LlavaForConditionalGeneration

    config = LlavaConfig(text_config={**TEXT, "model_type": "llama"}, image_token_index=image_token,
                         vision_config=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64,
                                            num_hidden_layers=3, num_attention_heads=2, image_size=56,
                                            patch_size=14), **options)
    save_random(LlavaForConditionalGeneration(config), path)
    (path / "preprocessor_config.json").write_text(json.dumps(PROCESSOR))
    return path


@pytest.fixture(scope="module")
def llava_path(tmp_path_factory):
    return write_llava(tmp_path_factory.mktemp("llava"))


@pytest.fixture(scope="module")
def hf_llava(llava_path):
    from transformers import AutoImageProcessor, LlavaForConditionalGeneration

    model = LlavaForConditionalGeneration.from_pretrained(str(llava_path), dtype=torch.float32,
                                                          attn_implementation="eager").eval()
    return model, AutoImageProcessor.from_pretrained(str(llava_path))


def image(seed: int, height: int = 60, width: int = 80) -> np.ndarray:
    return np.random.RandomState(seed).randint(0, 256, (height, width, 3), dtype=np.uint8)


def expanded(prompt: list[int]) -> list[int]:
    """The prompt as transformers' processor gives it: each image mark as its placeholders."""
    tokens: list[int] = []
    for token in prompt:
        tokens.extend([token] * TOKENS_PER_IMAGE if token == IMAGE_TOKEN else [token])
    return tokens


def hf_tokens(hf_llava, prompt: list[int], images: list[np.ndarray], max_tokens: int = 6) -> list[int]:
    model, processor = hf_llava
    ids = torch.tensor([expanded(prompt)])
    pixel_values = processor(images=images, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        out = model.generate(input_ids=ids, pixel_values=pixel_values, max_new_tokens=max_tokens, do_sample=False,
                             min_new_tokens=max_tokens, pad_token_id=0)
    return out[0, ids.shape[1]:].tolist()


def request(prompt: list[int], *images: np.ndarray) -> dict:
    return {"prompt_token_ids": prompt, "multi_modal_data": {"image": list(images) if len(images) > 1 else images[0]}}


def assert_healthy(llm):
    scheduler = llm.scheduler
    manager = scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks
    assert scheduler.get_num_unfinished_requests() == 0 and not llm.output_processor.has_unfinished_requests()


def test_the_image_encoder_equals_transformers(tmp_path):
    """Both feature strategies and a list of feature layers; checkpoints in transformers 5's layout and the
    Hub's (``vision_tower.vision_model.``, ``language_model.model.``) load the same encoder."""
    from safetensors.torch import load_file, save_file
    from transformers import LlavaForConditionalGeneration

    from engine.models.vision import load_image_encoder

    pixels = torch.randn(2, 3, 56, 56)
    for strategy, layer in (("default", -2), ("full", [-3, -1])):
        path = write_llava(tmp_path / strategy, vision_feature_select_strategy=strategy, vision_feature_layer=layer)
        hf = LlavaForConditionalGeneration.from_pretrained(str(path), dtype=torch.float32).eval()
        with torch.no_grad():
            expected = torch.stack(list(hf.model.get_image_features(
                pixels, vision_feature_layer=layer, vision_feature_select_strategy=strategy).pooler_output))
            encoder = load_image_encoder(path, torch.float32, torch.device("cpu"))
            torch.testing.assert_close(encoder(pixels), expected, atol=1e-5, rtol=0)
        assert encoder.tokens_per_image == TOKENS_PER_IMAGE + (strategy == "full")
    tensors = load_file(str(tmp_path / "default" / "model.safetensors"))
    hub = {name.replace("vision_tower.", "vision_tower.vision_model.").replace("model.language_model.",
                                                                                "language_model.model."): tensor
           for name, tensor in tensors.items()}
    save_file(hub, str(tmp_path / "default" / "model.safetensors"), metadata={"format": "pt"})
    with torch.no_grad():
        hub_encoder = load_image_encoder(tmp_path / "default", torch.float32, torch.device("cpu"))
        hf = LlavaForConditionalGeneration.from_pretrained(str(tmp_path / "default"), dtype=torch.float32).eval()
        expected = torch.stack(list(hf.model.get_image_features(pixels).pooler_output))
        torch.testing.assert_close(hub_encoder(pixels), expected, atol=1e-5, rtol=0)


def test_images_give_transformers_tokens_across_prefill_chunks(llava_path, hf_llava):
    """A step budget of 8 tokens cuts each 16-token image across chunks (the encoder runs once, on the first); two
    images in one prompt, and a text-only prompt beside them."""
    llm = LLM(model=str(llava_path), skip_tokenizer_init=True, dtype="float32", max_num_batched_tokens=8,
              block_size=4)
    prompts = [([1, 5, 6, IMAGE_TOKEN, 7, 8, 9], [image(0)]),
               ([1, IMAGE_TOKEN, 11, 12, IMAGE_TOKEN, 13], [image(1), image(2, 90, 70)])]
    outputs = llm.generate([request(prompt, *images) for prompt, images in prompts] + [[1, 20, 21, 22]], GREEDY,
                           use_tqdm=False)
    for (prompt, images), output in zip(prompts, outputs):
        assert output.prompt_token_ids == expanded(prompt)
        assert list(output.outputs[0].token_ids) == hf_tokens(hf_llava, prompt, images)
    assert llm.model_runner.encoder_outputs.num_items_encoded == 3
    assert_healthy(llm)


def test_prompt_logprobs_equal_transformers_logits(llava_path, hf_llava):
    model, processor = hf_llava
    prompt = [1, 5, IMAGE_TOKEN, 7, 8, 9]
    llm = LLM(model=str(llava_path), skip_tokenizer_init=True, dtype="float32", max_num_batched_tokens=12)
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    output = llm.generate([request(prompt, image(3))], params, use_tqdm=False)[0]
    ids = torch.tensor([expanded(prompt)])
    with torch.no_grad():
        logits = model(input_ids=ids, pixel_values=processor(images=[image(3)], return_tensors="pt")["pixel_values"]
                       ).logits[0]
    reference = torch.log_softmax(logits.float(), dim=-1)
    for position in range(1, ids.shape[1]):
        token = int(ids[0, position])
        assert output.prompt_logprobs[position][token].logprob == pytest.approx(
            reference[position - 1, token].item(), abs=1e-4)


def test_a_repeated_image_is_encoded_once_and_hits_the_prefix_cache(llava_path, hf_llava):
    """Two requests with the same image in one batch share one encoding; the same prompt later is a prefix hit past
    the image (no encoding at all); the same tokens with another image hit nothing past the text before it."""
    llm = LLM(model=str(llava_path), skip_tokenizer_init=True, dtype="float32", block_size=4)
    encoder = llm.model_runner.encoder_outputs
    cat, dog = image(4), image(5)
    prompt = [1, 5, 6, 7, IMAGE_TOKEN, 8, 9]
    first = llm.generate([request(prompt, cat), request(prompt + [10], cat)], GREEDY, use_tqdm=False)
    assert encoder.num_items_encoded == 1
    expected = hf_tokens(hf_llava, prompt, [cat])
    assert list(first[0].outputs[0].token_ids) == expected
    assert list(first[1].outputs[0].token_ids) == hf_tokens(hf_llava, prompt + [10], [cat])

    again = llm.generate([request(prompt, cat)], GREEDY, use_tqdm=False)[0]
    assert list(again.outputs[0].token_ids) == expected
    assert again.num_cached_tokens == 20  # 22 tokens: the five full blocks before the last token
    assert encoder.num_items_encoded == 1  # the hit covers the whole image
    other = llm.generate([request(prompt, dog)], GREEDY, use_tqdm=False)[0]
    assert other.num_cached_tokens == 4  # the text before the image only
    assert list(other.outputs[0].token_ids) == hf_tokens(hf_llava, prompt, [dog])
    assert encoder.num_items_encoded == 2
    assert_healthy(llm)


def test_images_survive_preemption(llava_path, hf_llava):
    """A KV pool too small for every request at once: requests with images are preempted and recomputed, their
    images encoded again when their kept outputs were freed, and the tokens stay transformers'."""
    llm = LLM(model=str(llava_path), skip_tokenizer_init=True, dtype="float32", block_size=4, num_gpu_blocks=20,
              max_num_batched_tokens=32, enable_prefix_caching=False)
    prompts = [([1, 30 + seed, IMAGE_TOKEN, 40 + seed], image(10 + seed)) for seed in range(4)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    outputs = llm.generate([request(prompt, picture) for prompt, picture in prompts], params, use_tqdm=False)
    assert llm.scheduler.num_preemptions_total > 0
    # The encoder cache holds two images (32 tokens): a preempted request found its image's output gone.
    assert llm.model_runner.encoder_outputs.num_items_encoded > len(prompts)
    for (prompt, picture), output in zip(prompts, outputs):
        assert list(output.outputs[0].token_ids) == hf_tokens(hf_llava, prompt, [picture], max_tokens=24)
    assert_healthy(llm)


@pytest.mark.parametrize("prompt,message", [
    (request([1, 5, 6], image(0)), r"prompt 0: multi_modal_data\['image'\] has 1 image\(s\) but the prompt marks 0"),
    (request([1, IMAGE_TOKEN, IMAGE_TOKEN, IMAGE_TOKEN], image(0)), r"a run of 3 image tokens; it must be 1"),
    ({"prompt_token_ids": [1, IMAGE_TOKEN], "multi_modal_data": {"video": image(0)}},
     r"multi_modal_data has \['video'\]; this engine takes images only"),
    (request([1, IMAGE_TOKEN], "cat.png"), r"multi_modal_data\['image'\]\[0\] must be a PIL image or an H x W x C"),
    ({"prompt_token_ids": [1, IMAGE_TOKEN], "multi_modal_data": [image(0)]}, r"multi_modal_data must be a dict"),
])
def test_bad_image_input_is_refused_by_name(llava_path, prompt, message):
    llm = LLM(model=str(llava_path), skip_tokenizer_init=True, dtype="float32", max_model_len=64)
    with pytest.raises(ValueError, match=message):
        llm.generate([prompt], GREEDY, use_tqdm=False)
    assert_healthy(llm)
    after = llm.generate([request([1, IMAGE_TOKEN, 5], image(0))], GREEDY, use_tqdm=False)[0]
    assert len(after.outputs[0].token_ids) == 6


def test_images_are_refused_where_they_cannot_go(llava_path, tmp_path_factory):
    from engine import BeamSearchParams
    from tests.engine.model_fixtures import make_tiny_llama

    text_only = LLM(model=str(make_tiny_llama(tmp_path_factory)), max_model_len=64)
    with pytest.raises(ValueError, match=r"prompt 0: multi_modal_data needs a vision-language model"):
        text_only.generate([request([1, 5], image(0))], GREEDY, use_tqdm=False)
    llm = LLM(model=str(llava_path), skip_tokenizer_init=True, dtype="float32", max_model_len=64)
    with pytest.raises(ValueError, match=r"beam search does not take multi_modal_data"):
        llm.beam_search([request([1, IMAGE_TOKEN], image(0))], BeamSearchParams(beam_width=2, max_tokens=2))
    with pytest.raises(ValueError, match=r"truncate_prompt_tokens=4 would cut a prompt with images"):
        llm.generate([request([1, IMAGE_TOKEN, 5], image(0))],
                     SamplingParams(max_tokens=2, truncate_prompt_tokens=4), use_tqdm=False)
    with pytest.raises(ValueError, match=r"prompt 0 has 80 tokens, more than the engine allows: 64"):
        llm.generate([request([1] * 64 + [IMAGE_TOKEN], image(0))], GREEDY, use_tqdm=False)
    assert_healthy(llm)
