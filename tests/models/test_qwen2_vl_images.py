"""Images in the real engine for Qwen2-VL, Qwen2.5-VL and Qwen3-VL (dense and MoE), on checkpoints transformers
writes: the vision transformer at each image's own resolution (2-d RoPE over rows and columns, blocks of 2 x 2
patches merged; Qwen2.5-VL's windows; Qwen3-VL's resampled position table and DeepStack levels) equals transformers', and the
language model's M-RoPE (three positions per token: an image's rows and columns, text resuming past the image, every
output token shifted by the difference; Qwen3-VL's interleaved) gives transformers' greedy tokens (by its forward) and
prompt logprobs (within 1e-4) through chunked prefill across images of different sizes, a prefix-cache hit past an
image and preemption. Turned off, M-RoPE's positions (and Qwen3-VL's DeepStack, and its interleaving) would change
the logprobs: the checks can fail."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from engine import LLM, SamplingParams
from tests.models.engine_generation import save_random
from tests.models.test_multimodal_text import TEXT

IMAGE, VIDEO, START, END = 500, 501, 502, 503
PROCESSOR = {"image_processor_type": "Qwen2VLImageProcessor", "min_pixels": 56 * 56, "max_pixels": 28 * 28 * 64,
             "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
             "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711]}
# Outputs never take the vision tokens' ids: transformers' forward, which the tokens are checked against, would read a
# generated image token as a placeholder. Both sides leave those ids out.
TEXT_IDS = [token for token in range(TEXT["vocab_size"]) if token not in (IMAGE, VIDEO, START, END)]


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, allowed_token_ids=TEXT_IDS)


GREEDY = greedy(8)


# Qwen2-VL's tower (LayerNorms, quick-GELU MLPs, full attention); Qwen2.5-VL's (RMSNorms, gated SiLU MLPs, windows
# of 2 x 2 merged blocks in every block but the second); Qwen3-VL's (a 4 x 4 position table resampled to each image,
# DeepStack levels after the first and third blocks, added by the language model after its two layers). Qwen3-VL's
# checkpoints cut 16-pixel patches; 14 here keeps one processor and one set of image sizes for the three families.
QWEN3_VISION = dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64,
                    num_position_embeddings=16, deepstack_visual_indexes=[0, 2])
FAMILIES = {
    "qwen2-vl": ("Qwen2VLConfig", "Qwen2VLForConditionalGeneration",
                 dict(depth=2, embed_dim=32, hidden_size=64, mlp_ratio=2, num_heads=2)),
    "qwen2.5-vl": ("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration",
                   dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64,
                        window_size=56, fullatt_block_indexes=[1])),
    "qwen3-vl": ("Qwen3VLConfig", "Qwen3VLForConditionalGeneration", QWEN3_VISION),
    "qwen3-vl-moe": ("Qwen3VLMoeConfig", "Qwen3VLMoeForConditionalGeneration", QWEN3_VISION),
}
# Qwen3-VL-MoE's language model: 4 experts, 2 a token (48 wide: its stacked tensors are not square).
MOE_TEXT = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48, decoder_sparse_step=1)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    return request.param


@pytest.fixture(scope="module")
def qwen2_vl(tmp_path_factory, family):
    import transformers

    config_name, model_name, vision = FAMILIES[family]
    path = tmp_path_factory.mktemp(family)
    rope = {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0,
            **({"mrope_interleaved": True} if family.startswith("qwen3") else {})}
    config = getattr(transformers, config_name)(
        text_config={**TEXT, "rope_parameters": rope, "eos_token_id": 2, "bos_token_id": 1,
                     **(MOE_TEXT if family == "qwen3-vl-moe" else {})},
        vision_config=dict(vision, patch_size=14, spatial_merge_size=2, temporal_patch_size=2),
        image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START, vision_end_token_id=END)
    save_random(getattr(transformers, model_name)(config), path)
    (path / "preprocessor_config.json").write_text(json.dumps(PROCESSOR))
    return path


@pytest.fixture(scope="module")
def hf(qwen2_vl, family):
    import transformers
    from transformers import AutoImageProcessor

    model = getattr(transformers, FAMILIES[family][1]).from_pretrained(str(qwen2_vl), dtype=torch.float32,
                                                                       attn_implementation="eager").eval()
    return model, AutoImageProcessor.from_pretrained(str(qwen2_vl))


def picture(seed: int, height: int, width: int) -> np.ndarray:
    return np.random.RandomState(seed).randint(0, 256, (height, width, 3), dtype=np.uint8)


def hf_tokens(hf, prompt_ids: list[int], images: list[np.ndarray], max_tokens: int = 8) -> list[int]:
    """transformers' greedy tokens by its model's forward over the whole sequence at each step (M-RoPE positions from
    its ``get_rope_index``, outputs as text after the prompt). Not ``generate``: in transformers 5.24 its cached
    decoding of Qwen2-VL departs from the same model's forward after a few tokens (seen here at the tenth), and the
    forward is the model's definition, which vLLM follows too."""
    model, processor = hf
    pixels = {}
    if images:
        processed = processor(images=images, return_tensors="pt")
        pixels = {"pixel_values": processed["pixel_values"], "image_grid_thw": processed["image_grid_thw"]}
    sequence = list(prompt_ids)
    for _ in range(max_tokens):
        ids = torch.tensor([sequence])
        with torch.no_grad():
            logits = model(input_ids=ids, mm_token_type_ids=(ids == IMAGE).int(), **pixels).logits[0, -1]
        sequence.append(TEXT_IDS[int(logits[TEXT_IDS].argmax())])
    return sequence[len(prompt_ids):]


def test_the_vision_transformer_equals_transformers(qwen2_vl, hf):
    from engine.models.vision import load_image_encoder

    model, processor = hf
    # The first is several windows of Qwen2.5-VL's, padded at the edges.
    processed = processor(images=[picture(0, 150, 220), picture(1, 120, 60)], return_tensors="pt")
    assert processed["image_grid_thw"].tolist() == [[1, 10, 16], [1, 8, 4]]
    encoder = load_image_encoder(qwen2_vl, torch.float32, torch.device("cpu"))
    items = encoder.split_processed(processed)
    assert [tokens for _, tokens in items] == [40, 8]
    with torch.no_grad():
        features = model.model.get_image_features(processed["pixel_values"], processed["image_grid_thw"])
        expected = list(features.pooler_output)
        # Qwen3-VL: each image's DeepStack levels beside its embeddings, as the encoder gives them.
        for level in getattr(features, "deepstack_features", None) or []:
            expected = [torch.cat([before, piece], dim=-1) for before, piece in zip(expected, level)]
        ours = encoder.encode([data for data, _ in items])
        assert len(ours) == len(expected) == 2
        for mine, theirs in zip(ours, expected):
            torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=0)


def test_images_of_two_sizes_give_transformers_tokens_across_chunks(qwen2_vl, hf):
    """An 8-token step budget cuts the 15-token image across chunks; a text-only prompt runs beside."""
    images = [picture(0, 90, 150), picture(1, 120, 60)]
    prompt = [1, 5, START, IMAGE, END, 7, 8, START, IMAGE, END, 9]
    llm = LLM(model=str(qwen2_vl), skip_tokenizer_init=True, dtype="float32", max_num_batched_tokens=8, block_size=4)
    outputs = llm.generate([{"prompt_token_ids": prompt, "multi_modal_data": {"image": images}}, [1, 20, 21, 22]],
                           GREEDY, use_tqdm=False)
    assert len(outputs[0].prompt_token_ids) == len(prompt) - 2 + 15 + 8
    assert list(outputs[0].outputs[0].token_ids) == hf_tokens(hf, outputs[0].prompt_token_ids, images)
    assert list(outputs[1].outputs[0].token_ids) == hf_tokens(hf, [1, 20, 21, 22], [])


def assert_prompt_logprobs(llm, hf, prompt, images, tolerance=1e-4) -> float:
    """The engine's prompt logprobs against transformers' logits; returns the largest difference."""
    model, processor = hf
    output = llm.generate([{"prompt_token_ids": prompt, "multi_modal_data": {"image": images}}],
                          SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0), use_tqdm=False)[0]
    ids = torch.tensor([output.prompt_token_ids])
    processed = processor(images=images, return_tensors="pt")
    with torch.no_grad():
        logits = model(input_ids=ids, pixel_values=processed["pixel_values"],
                       image_grid_thw=processed["image_grid_thw"], mm_token_type_ids=(ids == IMAGE).int()).logits[0]
    reference = torch.log_softmax(logits.float(), dim=-1)
    return max(abs(output.prompt_logprobs[position][int(ids[0, position])].logprob
                   - reference[position - 1, int(ids[0, position])].item()) for position in range(1, ids.shape[1]))


def test_prompt_logprobs_equal_transformers_and_need_mrope(qwen2_vl, hf, monkeypatch):
    images = [picture(2, 100, 100)]
    prompt = [1, 5, 6, START, IMAGE, END, 7, 8, 9, 10]
    llm = LLM(model=str(qwen2_vl), skip_tokenizer_init=True, dtype="float32", max_num_batched_tokens=12)
    assert assert_prompt_logprobs(llm, hf, prompt, images) < 1e-4
    # The same engine with plain positions for every token is off: M-RoPE's positions are what the test checks.
    llm.model_runner.mrope_merge_size = None
    llm.llm_engine.scheduler.reset_prefix_cache()
    assert assert_prompt_logprobs(llm, hf, prompt, images) > 1e-3


def test_qwen3_vl_needs_its_deepstack_and_interleaved_mrope(qwen2_vl, hf, family, monkeypatch):
    """Qwen3-VL's checks above can fail: without DeepStack's additions, or with M-RoPE's sections consecutive as
    Qwen2-VL's are, the prompt logprobs move away from transformers'."""
    import engine.runner.model_runner as model_runner
    from engine.models.rotary_embedding import RotaryEmbedding

    if not family.startswith("qwen3"):
        pytest.skip("DeepStack and interleaved M-RoPE are Qwen3-VL's")
    images = [picture(2, 100, 100)]
    prompt = [1, 5, 6, START, IMAGE, END, 7, 8, 9, 10]
    llm = LLM(model=str(qwen2_vl), skip_tokenizer_init=True, dtype="float32", max_num_batched_tokens=12,
              enable_prefix_caching=False)
    assert llm.model_runner.encoder_outputs.encoder.deepstack_levels == 2
    assert assert_prompt_logprobs(llm, hf, prompt, images) < 1e-4
    with monkeypatch.context() as patch:
        patch.setattr(model_runner, "deepstack_inputs", lambda placeholders, hidden_size: None)
        assert assert_prompt_logprobs(llm, hf, prompt, images) > 1e-3
    rotaries = [module for module in llm.model_runner.model.modules() if isinstance(module, RotaryEmbedding)]
    assert rotaries and all(module.mrope_interleaved for module in rotaries)
    for module in rotaries:
        module.mrope_interleaved = False
    assert assert_prompt_logprobs(llm, hf, prompt, images) > 1e-3


def test_qwen3_vl_moe_loads_the_published_layout_of_its_experts(qwen2_vl, hf, family, tmp_path):
    """The Hub's Qwen3-VL-MoE checkpoints stack each layer's experts for a batched matmul ([experts, hidden,
    2 x intermediate], [experts, intermediate, hidden]); transformers 5 writes them transposed. Both give the same
    tokens."""
    import shutil

    from safetensors.torch import load_file, save_file

    if family != "qwen3-vl-moe":
        pytest.skip("stacked experts are Qwen3-VL-MoE's")
    published = tmp_path / "published"
    shutil.copytree(qwen2_vl, published)
    tensors = load_file(str(published / "model.safetensors"))
    stacked = [name for name in tensors if name.endswith(("experts.gate_up_proj", "experts.down_proj"))]
    assert len(stacked) == 2 * TEXT["num_hidden_layers"]
    for name in stacked:
        tensors[name] = tensors[name].transpose(1, 2).contiguous()
    save_file(tensors, str(published / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((published / "config.json").read_text())
    text = config["text_config"]
    text["num_experts"] = text.pop("num_local_experts")  # the Hub's configs name it so
    (published / "config.json").write_text(json.dumps(config))
    images = [picture(4, 90, 120)]
    prompt = [1, 5, START, IMAGE, END, 6, 7]
    llm = LLM(model=str(published), skip_tokenizer_init=True, dtype="float32")
    output = llm.generate([{"prompt_token_ids": prompt, "multi_modal_data": {"image": images}}], GREEDY,
                          use_tqdm=False)[0]
    assert list(output.outputs[0].token_ids) == hf_tokens(hf, output.prompt_token_ids, images)


def test_decodes_after_images_replay_graphs_at_their_shifted_positions(qwen2_vl, hf, family):
    """A decode's three M-RoPE positions are equal (index + delta), so its step runs as plain RoPE at that position
    and replays a CUDA graph (emulated on the CPU: the same static buffers and padding), with transformers' tokens."""
    from kernels.triton_support import triton_unavailable_reason
    from tests.runner.test_step_fast_paths import _generate_through_emulated_graphs

    if family != "qwen2-vl":
        pytest.skip("one family shows it: the graph path is the language model's")
    if triton_unavailable_reason() is not None:
        pytest.skip(f"triton cannot run here: {triton_unavailable_reason()}")
    llm = LLM(model=str(qwen2_vl), skip_tokenizer_init=True, dtype="float32", attention_backend="triton",
              enforce_eager=True, max_num_seqs=4)
    images = [picture(20, 90, 150), picture(21, 60, 60)]
    prompts = [{"prompt_token_ids": [1, 5, START, IMAGE, END, 7], "multi_modal_data": {"image": [image]}}
               for image in images]
    tokens, batch_sizes = _generate_through_emulated_graphs(llm, prompts, GREEDY)
    assert batch_sizes and max(batch_sizes) == 2  # both requests' decodes on the graph path
    for prompt, image, output in zip(prompts, images, tokens):
        expanded = llm.generate([prompt], greedy(1), use_tqdm=False)[0].prompt_token_ids
        assert list(output) == hf_tokens(hf, expanded, [image])


def test_a_prefix_hit_past_an_image_and_preemption_keep_transformers_tokens(qwen2_vl, hf):
    images = [picture(3, 70, 130)]
    prompt = [1, 5, 6, 7, START, IMAGE, END, 8, 9]
    llm = LLM(model=str(qwen2_vl), skip_tokenizer_init=True, dtype="float32", block_size=4)
    first = llm.generate([{"prompt_token_ids": prompt, "multi_modal_data": {"image": images}}], GREEDY,
                         use_tqdm=False)[0]
    expected = hf_tokens(hf, first.prompt_token_ids, images)
    assert list(first.outputs[0].token_ids) == expected
    again = llm.generate([{"prompt_token_ids": prompt, "multi_modal_data": {"image": images}}], GREEDY,
                         use_tqdm=False)[0]
    assert again.num_cached_tokens > 4 + 10 and list(again.outputs[0].token_ids) == expected

    small = LLM(model=str(qwen2_vl), skip_tokenizer_init=True, dtype="float32", block_size=4, num_gpu_blocks=20,
                max_num_batched_tokens=32, enable_prefix_caching=False)
    prompts = [([1, 30 + seed, START, IMAGE, END, 40 + seed], picture(10 + seed, 60 + 20 * seed, 80))
               for seed in range(4)]
    params = greedy(24)
    outputs = small.generate([{"prompt_token_ids": p, "multi_modal_data": {"image": image}} for p, image in prompts],
                             params, use_tqdm=False)
    assert small.scheduler.num_preemptions_total > 0
    for (_, image), output in zip(prompts, outputs):
        assert list(output.outputs[0].token_ids) == hf_tokens(hf, output.prompt_token_ids, [image], max_tokens=24)


def test_a_real_run_draws_each_image_at_its_size_and_replays_exactly(qwen2_vl, tmp_path):
    """A workload's images of 4-16 tokens each, from a pool, recorded on the real engine (each picture drawn at a size
    the processor keeps) and replayed by the simulator with exactly the same decisions; counts the processor would
    change are refused by name."""
    from analysis import read_run
    from sim.real_engine import build_real_engine
    from sim.vision_setup import VisionSetupError
    from tests.models.image_real_runs import image_workload, record
    from tests.sim.test_sliding_window_real_run import assert_replays_exactly

    real = record(image_workload("qwen-images", 5, {"type": "uniform", "min": 4, "max": 16}), qwen2_vl,
                  tmp_path / "real")
    assert real.info["tokens_per_image"] is None
    run = read_run(tmp_path / "real")
    assert run.summary["num_finished"] == 10 and int(run.steps["num_encoder_items"].sum()) > 0
    assert len(set(run.requests["num_image_tokens"]) - {0}) > 1  # images of several sizes
    assert_replays_exactly(tmp_path / "real")
    with pytest.raises(VisionSetupError, match=r"workload.images.tokens_per_image: the real model's images take as "
                                               r"many tokens as their resolution gives, at most 64"):
        build_real_engine(image_workload("qwen-images", 5, {"type": "constant", "value": 100}), model=str(qwen2_vl),
                          threads=1)


def test_a_checkpoint_without_its_image_processor_serves_text(qwen2_vl, tmp_path, caplog):
    """No preprocessor_config.json: the engine cannot prepare images, so it says so, serves text, and refuses images."""
    import shutil

    copy = tmp_path / "no-processor"
    shutil.copytree(qwen2_vl, copy)
    (copy / "preprocessor_config.json").unlink()
    with caplog.at_level("WARNING"):
        llm = LLM(model=str(copy), skip_tokenizer_init=True, dtype="float32", max_model_len=128)
    assert "has no preprocessor_config.json" in caplog.text and llm.image_inputs is None
    assert len(llm.generate([[1, 5, 6]], greedy(3), use_tqdm=False)[0].outputs[0].token_ids) == 3
    with pytest.raises(ValueError, match=r"prompt 0: multi_modal_data needs a vision-language model"):
        llm.generate([{"prompt_token_ids": [1, START, IMAGE, END], "multi_modal_data": {"image": picture(0, 60, 60)}}],
                     greedy(2), use_tqdm=False)
