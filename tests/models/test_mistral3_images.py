"""Images in the real engine for Mistral 3 (Mistral Small 3.1+), on a checkpoint transformers writes: the Pixtral tower
at each image's own resolution and the 2 x 2 patch merger equal transformers' at the image-token positions, each
image's span is the processor's grid (rows of [IMG] ended by [IMG_BREAK], the last by [IMG_END]) holding the language
model's own embeddings of those marks, and prompt logprobs (within 1e-4) and greedy tokens equal transformers' through
chunked prefill and a prefix hit past an image. Without the tokenizer the marks' ids are unknown: refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from engine import LLM, SamplingParams
from tests.models.engine_generation import save_random
from tests.models.test_multimodal_text import TEXT

IMAGE, BREAK, END = 509, 510, 511
TEXT_IDS = [token for token in range(TEXT["vocab_size"]) if token not in (IMAGE, BREAK, END)]


@pytest.fixture(scope="module")
def mistral3(tmp_path_factory):
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    from engine.models.synthetic_tokenizer import train_tokenizer

    path = tmp_path_factory.mktemp("mistral3")
    config = Mistral3Config(text_config={**TEXT, "model_type": "mistral", "sliding_window": None},
                            vision_config=dict(model_type="pixtral", hidden_size=32, intermediate_size=64,
                                               num_hidden_layers=2, num_attention_heads=2, image_size=112,
                                               patch_size=14, head_dim=16),
                            image_token_index=IMAGE, spatial_merge_size=2)
    save_random(Mistral3ForConditionalGeneration(config), path)
    tokenizer = train_tokenizer(IMAGE, 256)
    tokenizer.add_special_tokens({"additional_special_tokens": ["[IMG]", "[IMG_BREAK]", "[IMG_END]"]})
    tokenizer.save_pretrained(str(path))
    (path / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "PixtralImageProcessor", "patch_size": 14, "size": {"longest_edge": 112},
        "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
        "do_resize": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True, "resample": 3,
        "rescale_factor": 1 / 255}))
    (path / "processor_config.json").write_text(json.dumps({
        "image_token": "[IMG]", "image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]", "patch_size": 14,
        "spatial_merge_size": 2}))
    return path


@pytest.fixture(scope="module")
def hf(mistral3):
    from transformers import AutoImageProcessor, Mistral3ForConditionalGeneration

    model = Mistral3ForConditionalGeneration.from_pretrained(str(mistral3), dtype=torch.float32,
                                                             attn_implementation="eager").eval()
    return model, AutoImageProcessor.from_pretrained(str(mistral3))


def picture(seed: int, height: int, width: int) -> np.ndarray:
    return np.random.RandomState(seed).randint(0, 256, (height, width, 3), dtype=np.uint8)


def hf_logits(hf, ids: list[int], images) -> torch.Tensor:
    model, processor = hf
    processed = processor(images=images, return_tensors="pt")
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), pixel_values=processed["pixel_values"],
                     image_sizes=processed["image_sizes"]).logits[0]


def hf_greedy(hf, prompt_ids: list[int], images, max_tokens: int) -> list[int]:
    """transformers' greedy tokens by its forward over the whole sequence, off the image marks' ids (a generated
    [IMG] would be read as a placeholder)."""
    sequence = list(prompt_ids)
    for _ in range(max_tokens):
        sequence.append(TEXT_IDS[int(hf_logits(hf, sequence, images)[-1, TEXT_IDS].argmax())])
    return sequence[len(prompt_ids):]


def test_the_encoder_equals_transformers_and_spans_hold_the_row_marks(mistral3, hf):
    from transformers import AutoTokenizer

    from engine.models import load_model
    from engine.models.vision import load_image_encoder

    model, processor = hf
    processed = processor(images=[picture(0, 90, 150), picture(1, 120, 70)], return_tensors="pt")
    encoder = load_image_encoder(mistral3, torch.float32, torch.device("cpu"))
    language_model, _ = load_model(mistral3, torch.float32, "cpu")
    encoder.attach_language_model(language_model, AutoTokenizer.from_pretrained(str(mistral3)), mistral3)
    items = encoder.split_processed(processed)
    # 70 x 112 pixels: 5 x 8 patches, 2 x 4 merged tokens (the odd row dropped), each row and its break: 10.
    assert [tokens for _, tokens in items] == [10, 12]
    assert encoder.placeholder_ids(items[0][0]) == [IMAGE] * 4 + [BREAK] + [IMAGE] * 4 + [END]
    with torch.no_grad():
        expected = model.model.get_image_features(processed["pixel_values"], processed["image_sizes"],
                                                  vision_feature_layer=-1).pooler_output
        spans = encoder.encode([data for data, _ in items])
        marks = language_model.embed_input_ids(torch.tensor([BREAK, END]))
    for (data, _), span, theirs in zip(items, spans, expected):
        ids = torch.tensor(encoder.placeholder_ids(data))
        torch.testing.assert_close(span[ids == IMAGE], theirs, atol=1e-5, rtol=0)
        torch.testing.assert_close(span[ids == BREAK], marks[0].expand(int((ids == BREAK).sum()), -1))
        torch.testing.assert_close(span[-1], marks[1])


def test_prompt_logprobs_and_greedy_tokens_equal_transformers(mistral3, hf):
    images = [picture(0, 90, 150), picture(1, 120, 70)]
    prompt = [1, 5, IMAGE, 7, 8, IMAGE, 9]
    llm = LLM(model=str(mistral3), dtype="float32", max_num_batched_tokens=8, block_size=4)
    request = {"prompt_token_ids": prompt, "multi_modal_data": {"image": images}}
    output = llm.generate([request], SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0),
                          use_tqdm=False)[0]
    ids = output.prompt_token_ids
    assert len(ids) == len(prompt) - 2 + 10 + 12 and ids.count(BREAK) == 1 + 3 and ids.count(END) == 2
    reference = torch.log_softmax(hf_logits(hf, ids, images), dim=-1)
    for position in range(1, len(ids)):
        assert output.prompt_logprobs[position][ids[position]].logprob == pytest.approx(
            reference[position - 1, ids[position]].item(), abs=1e-4)
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, allowed_token_ids=TEXT_IDS)
    tokens = llm.generate([request], greedy, use_tqdm=False)[0]
    assert tokens.num_cached_tokens > 0  # the same images after the same tokens: a prefix hit past both
    assert list(tokens.outputs[0].token_ids) == hf_greedy(hf, ids, images, 8)


def test_without_the_tokenizer_the_row_marks_are_unknown(mistral3):
    """Text is served as before; an image is refused by name, and the engine stays healthy."""
    llm = LLM(model=str(mistral3), dtype="float32", skip_tokenizer_init=True)
    with pytest.raises(ValueError, match=r"prompt 0: model .* Mistral 3 images need the checkpoint's tokenizer"):
        llm.generate([{"prompt_token_ids": [1, IMAGE, 5], "multi_modal_data": {"image": picture(0, 60, 60)}}],
                     SamplingParams(max_tokens=2), use_tqdm=False)
    assert len(llm.generate([[1, 5, 6]], SamplingParams(max_tokens=3, ignore_eos=True),
                            use_tqdm=False)[0].outputs[0].token_ids) == 3
    manager = llm.scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks


def test_a_real_run_draws_each_grid_and_replays_exactly(mistral3, tmp_path):
    """Images of 12 tokens (3 rows of 3 tokens and a break: 84 x 84 pixels), recorded and replayed exactly; a count no
    grid within the processor's largest image makes is refused by name."""
    from analysis import read_run
    from sim.vision_setup import VisionSetupError
    from tests.models.image_real_runs import image_workload, record
    from tests.sim.test_sliding_window_real_run import assert_replays_exactly

    record(image_workload("mistral3-images", 6, {"type": "constant", "value": 12}, num_requests=8, distinct=3),
           mistral3, tmp_path / "real")
    assert read_run(tmp_path / "real").summary["num_finished"] == 8
    assert_replays_exactly(tmp_path / "real")
    with pytest.raises(VisionSetupError, match=r"workload.images.tokens_per_image: image .* of 7 tokens came out of "
                                               r"the model's image processor as"):
        record(image_workload("mistral3-images", 6, {"type": "constant", "value": 7}, num_requests=8, distinct=3),
               mistral3, tmp_path / "bad")
