"""Gemma 3 images in the real engine, on a checkpoint transformers writes: the SigLIP tower and the pooling projector
equal transformers'; each ``<start_of_image>`` becomes the processor's span (a blank line, the mark, the image
tokens, the end mark, a blank line); the language model attends among one image's tokens both ways (within a
sliding layer's window too) and the engine keeps each image in one prefill chunk, so prompt logprobs (within 1e-4)
and greedy tokens equal transformers' through chunks, two images, a prefix hit that ends inside an image and
preemption. Attended causally instead, the logprobs move away: the check can fail."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from engine import LLM, SamplingParams
from tests.models.engine_generation import save_random
from tests.models.image_references import greedy_by_forward, prompt_logprob_error
from tests.models.test_multimodal_text import TEXT

IMAGE, START, END, BLANK = 500, 501, 502, 503
TOKENS = 16  # a 112-pixel image: 8 x 8 patches of 14, pooled 2 x 2
# Outputs never take the image tokens' ids: transformers' forward, which the tokens are checked against, would read a
# generated image token as a placeholder.
TEXT_IDS = [token for token in range(TEXT["vocab_size"]) if token not in (IMAGE, START, END, BLANK)]


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, allowed_token_ids=TEXT_IDS)


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    from engine.models.synthetic_tokenizer import train_tokenizer

    path = tmp_path_factory.mktemp("gemma3")
    # A sliding layer whose 12-token window is shorter than an image, then a global one.
    config = Gemma3Config(text_config={**TEXT, "sliding_window": 12,
                                       "layer_types": ["sliding_attention", "full_attention"]},
                          vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                             num_attention_heads=2, image_size=112, patch_size=14),
                          mm_tokens_per_image=TOKENS, image_token_index=IMAGE, boi_token_index=START,
                          eoi_token_index=END)
    save_random(Gemma3ForConditionalGeneration(config), path)
    tokenizer = train_tokenizer(IMAGE, 256)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image_soft_token>", "<start_of_image>",
                                                                "<end_of_image>"]})
    tokenizer.add_tokens(["\n\n"])
    assert tokenizer.convert_tokens_to_ids(["<start_of_image>", "\n\n"]) == [START, BLANK]
    tokenizer.save_pretrained(str(path))
    (path / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Gemma3ImageProcessor", "size": {"height": 112, "width": 112},
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_resize": True, "do_rescale": True,
        "do_normalize": True, "do_convert_rgb": True, "resample": 2, "rescale_factor": 1 / 255,
        "do_pan_and_scan": False}))
    return path


@pytest.fixture(scope="module")
def hf(gemma3):
    from transformers import AutoImageProcessor, Gemma3ForConditionalGeneration

    model = Gemma3ForConditionalGeneration.from_pretrained(str(gemma3), dtype=torch.float32,
                                                           attn_implementation="eager").eval()
    return model, AutoImageProcessor.from_pretrained(str(gemma3))


@pytest.fixture(scope="module")
def llm(gemma3):
    return LLM(model=str(gemma3), dtype="float32", block_size=4, max_num_batched_tokens=32)


def picture(seed: int, height: int = 90, width: int = 120) -> np.ndarray:
    return np.random.RandomState(seed).randint(0, 256, (height, width, 3), dtype=np.uint8)


def hf_logits(hf, ids: list[int], images: list[np.ndarray]) -> torch.Tensor:
    """transformers' logits over ``ids`` (its image tokens marked by token_type_ids, which turn on the both-ways
    attention among them)."""
    model, processor = hf
    tensor = torch.tensor([ids])
    pixels = {"pixel_values": processor(images=images, return_tensors="pt")["pixel_values"]} if images else {}
    with torch.no_grad():
        return model(input_ids=tensor, token_type_ids=(tensor == IMAGE).long(), **pixels).logits[0]


def hf_tokens(hf, prompt_ids: list[int], images: list[np.ndarray], max_tokens: int = 8) -> list[int]:
    return greedy_by_forward(lambda ids: hf_logits(hf, ids, images), prompt_ids, TEXT_IDS, max_tokens)


def logprob_error(llm, hf, prompt: list[int], images: list[np.ndarray]) -> float:
    output = llm.generate([{"prompt_token_ids": prompt, "multi_modal_data": {"image": images}}],
                          SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0), use_tqdm=False)[0]
    return prompt_logprob_error(output, hf_logits(hf, output.prompt_token_ids, images))


def test_the_tower_and_projector_equal_transformers(gemma3, hf):
    from engine.models.vision import load_image_encoder

    model, processor = hf
    processed = processor(images=[picture(0), picture(1, 60, 60)], return_tensors="pt")
    encoder = load_image_encoder(gemma3, torch.float32, torch.device("cpu"))
    items = encoder.split_processed(processed)
    assert [tokens for _, tokens in items] == [TOKENS, TOKENS]
    with torch.no_grad():
        expected = model.model.get_image_features(processed["pixel_values"]).pooler_output
        for ours, theirs in zip(encoder.encode([data for data, _ in items]), expected):
            torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)


def test_a_mark_becomes_the_processors_span_and_the_logprobs_need_both_ways_attention(llm, hf, monkeypatch):
    import engine.runner.model_runner as model_runner

    prompt = [1, 5, 6, START, 7, 8, 9]
    output = llm.generate([{"prompt_token_ids": prompt, "multi_modal_data": {"image": picture(2)}}], greedy(1),
                          use_tqdm=False)[0]
    assert output.prompt_token_ids == [1, 5, 6, BLANK, START] + [IMAGE] * TOKENS + [END, BLANK, 7, 8, 9]
    llm.llm_engine.scheduler.reset_prefix_cache()
    assert logprob_error(llm, hf, prompt, [picture(2)]) < 1e-4
    # The same engine attending image tokens causally is off: the both-ways spans are what the check checks.
    llm.llm_engine.scheduler.reset_prefix_cache()
    monkeypatch.setattr(model_runner, "bidirectional_spans", lambda *args: None)
    assert logprob_error(llm, hf, prompt, [picture(2)]) > 1e-3


def test_an_expanded_prompt_is_taken_as_it_is(llm, hf):
    """A prompt rendered by transformers' processor (the span already written) is not expanded again."""
    expanded = [1, 5, BLANK, START] + [IMAGE] * TOKENS + [END, BLANK, 9]
    output = llm.generate([{"prompt_token_ids": expanded, "multi_modal_data": {"image": picture(3)}}], greedy(1),
                          use_tqdm=False)[0]
    assert output.prompt_token_ids == expanded


def test_two_images_in_chunks_keep_transformers_tokens_and_never_split(gemma3, hf):
    """A 32-token step budget: each 20-token image span fits one chunk only if the chunk starts before it, so the
    engine cuts chunks before images (disable_chunked_mm_input, forced for Gemma 3); a text request runs beside."""
    llm = LLM(model=str(gemma3), dtype="float32", block_size=4, max_num_batched_tokens=24)
    assert llm.llm_engine.scheduler.disable_chunked_mm_input
    images = [picture(4), picture(5, 70, 70)]
    prompt = [1, 5, 6, 7, 8, 9, 10, START, 11, 12, START, 13]
    outputs = llm.generate([{"prompt_token_ids": prompt, "multi_modal_data": {"image": images}},
                            [1, 20, 21, 22, 23]], greedy(8), use_tqdm=False)
    assert list(outputs[0].outputs[0].token_ids) == hf_tokens(hf, outputs[0].prompt_token_ids, images)
    assert list(outputs[1].outputs[0].token_ids) == hf_tokens(hf, [1, 20, 21, 22, 23], [])


def test_a_prefix_hit_ending_inside_an_image_and_preemption_keep_transformers_tokens(gemma3, hf):
    """Blocks of 4: the second request shares the first's prefix through part of the image, so its prefix hit ends
    inside the image and its first chunk starts there (the cached keys of the image's first tokens were computed
    seeing the whole image); then requests preempted and recomputed."""
    llm = LLM(model=str(gemma3), dtype="float32", block_size=4)
    image = picture(6)
    first = llm.generate([{"prompt_token_ids": [1, 5, 6, START, 7], "multi_modal_data": {"image": image}}],
                         greedy(8), use_tqdm=False)[0]
    assert list(first.outputs[0].token_ids) == hf_tokens(hf, first.prompt_token_ids, [image])
    second = llm.generate([{"prompt_token_ids": [1, 5, 6, START, 8, 9], "multi_modal_data": {"image": image}}],
                          greedy(8), use_tqdm=False)[0]
    # The image spans positions 5-20; the shared tokens end at its end mark (21), so the hit stops at block 20.
    assert 5 < second.num_cached_tokens < 21
    assert list(second.outputs[0].token_ids) == hf_tokens(hf, second.prompt_token_ids, [image])

    small = LLM(model=str(gemma3), dtype="float32", block_size=4, num_gpu_blocks=24, max_num_batched_tokens=32,
                enable_prefix_caching=False)
    prompts = [([1, 30 + seed, START, 40 + seed], picture(10 + seed)) for seed in range(4)]
    outputs = small.generate([{"prompt_token_ids": p, "multi_modal_data": {"image": image}} for p, image in prompts],
                             greedy(20), use_tqdm=False)
    assert small.scheduler.num_preemptions_total > 0
    for (_, image), output in zip(prompts, outputs):
        assert list(output.outputs[0].token_ids) == hf_tokens(hf, output.prompt_token_ids, [image], max_tokens=20)


def test_chat_marks_images_where_the_template_puts_them(llm):
    message = {"role": "user", "content": [{"type": "image_pil", "image_pil": picture(7)},
                                           {"type": "text", "text": "What is it?"}]}
    output = llm.chat([message], greedy(3), use_tqdm=False)[0]
    ids = output.prompt_token_ids
    start = ids.index(START)
    assert ids[start - 1:start + TOKENS + 3] == [BLANK, START] + [IMAGE] * TOKENS + [END, BLANK]
    assert len(output.outputs[0].token_ids) == 3


def test_without_the_tokenizer_images_are_refused_by_name(gemma3):
    llm = LLM(model=str(gemma3), dtype="float32", skip_tokenizer_init=True)
    with pytest.raises(ValueError, match=r"prompt 0: .*Gemma 3 images need the checkpoint's tokenizer"):
        llm.generate([{"prompt_token_ids": [1, START, 5], "multi_modal_data": {"image": picture(0)}}], greedy(2),
                     use_tqdm=False)
    assert len(llm.generate([[1, 5, 6]], greedy(3), use_tqdm=False)[0].outputs[0].token_ids) == 3


def test_a_real_run_keeps_images_whole_and_replays_exactly(gemma3, tmp_path):
    """A workload's 16-token images recorded on the real engine, which keeps each image in one chunk; the simulator
    (which reads the checkpoint's Gemma 3 tower as one whose images stay whole) replays every decision."""
    from analysis import read_run
    from tests.models.image_real_runs import image_workload, record
    from tests.sim.test_sliding_window_real_run import assert_replays_exactly

    real = record(image_workload("gemma3-images", 7, {"type": "constant", "value": TOKENS}), gemma3,
                  tmp_path / "real")
    assert real.engine.scheduler.disable_chunked_mm_input
    run = read_run(tmp_path / "real")
    assert run.summary["num_finished"] == 10 and int(run.steps["num_encoder_items"].sum()) > 0
    assert_replays_exactly(tmp_path / "real")


def test_the_triton_backend_attends_images_both_ways_too(gemma3, hf):
    """The triton kernel (under Triton's interpreter here) takes the same spans: logprobs within 1e-4 of
    transformers' and greedy tokens equal, with images cut out of chunks before them."""
    from kernels.triton_support import triton_unavailable_reason

    if triton_unavailable_reason() is not None:
        pytest.skip(f"triton cannot run here: {triton_unavailable_reason()}")
    llm = LLM(model=str(gemma3), dtype="float32", block_size=4, max_num_batched_tokens=24, attention_backend="triton",
              enforce_eager=True)
    assert llm.image_inputs is not None
    images = [picture(8), picture(9, 70, 70)]
    prompt = [1, 5, 6, START, 7, START, 8]
    assert logprob_error(llm, hf, prompt, images) < 1e-4
    output = llm.generate([{"prompt_token_ids": prompt, "multi_modal_data": {"image": images}}], greedy(6),
                          use_tqdm=False)[0]
    assert list(output.outputs[0].token_ids) == hf_tokens(hf, output.prompt_token_ids, images, max_tokens=6)
