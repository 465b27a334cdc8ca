"""The vision encoder in the analytical cost model: shapes, presets, and what a step that encodes images costs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim.cost_models.analytical import AnalyticalCostModel
from sim.cost_models.step_batch import StepBatch, step_features
from sim.cost_models.vision_encoder_cost import (KERNELS_OUTSIDE_ENCODER_LAYERS, KERNELS_PER_ENCODER_LAYER,
                                                 VisionEncoderCost)
from sim.hardware import resolve_hardware
from sim.model_presets import resolve_model
from sim.vision_encoders import (MODEL_VISION_ENCODERS, VISION_ENCODER_PRESETS, VisionEncoderShape,
                                 resolve_vision_encoder)

H100 = resolve_hardware("h100-sxm")


def encoder_cost(model_name: str, hardware: str = "h100-sxm", tensor_parallel_size: int = 1) -> VisionEncoderCost:
    return VisionEncoderCost(resolve_vision_encoder(model_name, None), resolve_hardware(hardware), "bfloat16",
                             tensor_parallel_size)


def one_image(tokens: int) -> tuple[int, int]:
    return tokens, tokens * tokens


# --- shapes and presets --------------------------------------------------------------------------------------

def test_presets_have_their_published_parameter_counts():
    clip, siglip, qwen = (VISION_ENCODER_PRESETS[name] for name in ("clip-vit-l-336", "siglip-so400m-896",
                                                                    "qwen2-vl-vit"))
    # CLIP ViT-L/14's 303M tower for 24 layers; LLaVA runs 23 of them. Its projector: LLaVA-1.5's 21M mm_projector.
    assert clip.vision_tower_parameters / 1e6 == pytest.approx(303 * 23 / 24, rel=0.02)
    assert clip.projector_parameters / 1e6 == pytest.approx(21.0, rel=0.01)
    # SigLIP so400m: 412M (417M in the Gemma 3 report, counting its embeddings at 896 px).
    assert siglip.vision_tower_parameters / 1e6 == pytest.approx(412, rel=0.02)
    # Qwen2-VL-7B's vision encoder, merger included: 675M.
    assert qwen.num_parameters / 1e6 == pytest.approx(675, rel=0.02)


def test_gated_mlp_adds_a_matrix_per_layer():
    clip = VISION_ENCODER_PRESETS["clip-vit-l-336"]
    gated = replace(clip, gated_mlp=True)
    assert gated.vision_tower_parameters - clip.vision_tower_parameters == 23 * 1024 * 4096


def test_flops_by_hand():
    siglip = VISION_ENCODER_PRESETS["siglip-so400m-896"]
    tokens, work = one_image(256)
    layer = 4 * 1152 * 1152 + 2 * 1152 * 4304
    assert siglip.linear_flops(tokens) == 2 * 4096 * 27 * layer + 2 * 256 * 1152 * 3840
    assert siglip.attention_flops(work) == 4 * 27 * 1152 * 4096 * 4096  # every patch pair of the 4096
    assert siglip.flops(tokens, work) == siglip.linear_flops(tokens) + siglip.attention_flops(work)


def test_each_multimodal_model_preset_has_its_encoder_and_language_model():
    for model_name, encoder in MODEL_VISION_ENCODERS.items():
        resolve_model(model_name)  # every mapped model is an LLM preset
        assert resolve_vision_encoder(model_name, None) is encoder
    # Gemma 3's projector maps into each size's hidden width.
    for model_name in ("gemma-3-4b", "gemma-3-12b", "gemma-3-27b"):
        encoder = resolve_vision_encoder(model_name, None)
        assert encoder.name == "siglip-so400m-896"
        assert encoder.projector_parameters == 1152 * resolve_model(model_name).hidden_size
    assert resolve_vision_encoder("llava-1.5-7b", None).tokens_per_image == 576
    assert resolve_vision_encoder("QWEN2-VL-7B", None).tokens_per_image is None  # dynamic resolution


def test_resolve_vision_encoder_cases():
    assert resolve_vision_encoder("llama-3-8b", None) is None  # a text-only model has none
    assert resolve_vision_encoder("llama-3-8b", "clip-vit-l-336") is VISION_ENCODER_PRESETS["clip-vit-l-336"]
    inline = dict(VISION_ENCODER_PRESETS["qwen2-vl-vit"].to_dict(), name="my-vit", num_layers=4)
    encoder = resolve_vision_encoder("qwen2-vl-7b", inline)
    assert encoder == replace(VISION_ENCODER_PRESETS["qwen2-vl-vit"], name="my-vit", num_layers=4)
    assert resolve_vision_encoder("qwen2-vl-7b", encoder) is encoder


@pytest.mark.parametrize("spec, message", [
    ("vit-g", r"vision_encoder: unknown preset 'vit-g'; presets: clip-vit-l-336, siglip-so400m-896, qwen2-vl-vit"),
    (7, "vision_encoder: expected a preset name or a mapping"),
    ({"name": "x", "layers": 3}, "vision_encoder: unknown key 'layers'"),
    ({"name": "x", "num_layers": 3}, "vision_encoder: missing keys 'hidden_size', 'intermediate_size'"),
])
def test_bad_specs_name_the_problem(spec, message):
    with pytest.raises(ValueError, match=message):
        resolve_vision_encoder("gemma-3-12b", spec)


@pytest.mark.parametrize("field, value, message", [
    ("name", "", "vision_encoder.name must be a non-empty string"),
    ("num_layers", 0, "vision_encoder.num_layers must be a positive integer, got 0"),
    ("hidden_size", 1024.0, "vision_encoder.hidden_size must be a positive integer, got 1024.0"),
    ("patches_per_token", True, "vision_encoder.patches_per_token must be a positive integer, got True"),
    ("num_attention_heads", 3, "vision_encoder.num_attention_heads must divide hidden_size"),
    ("tokens_per_image", 0, "vision_encoder.tokens_per_image must be a positive integer or None"),
    ("projector_parameters", -1, "vision_encoder.projector_parameters must be an integer >= 0"),
    ("gated_mlp", "no", "vision_encoder.gated_mlp must be true or false"),
])
def test_bad_fields_name_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        replace(VISION_ENCODER_PRESETS["clip-vit-l-336"], **{field: value})


# --- the encoder's time ----------------------------------------------------------------------------------------

def test_gemma_3_12b_image_on_an_h100_by_hand():
    """One 256-token image (4096 patches) through SigLIP: compute-bound, every figure from the datasheet."""
    h, i, layers, patches, tokens = 1152, 4304, 27, 4096, 256
    gemm_flops = 989.5e12 * 0.68  # h100-sxm: dense bf16 peak times the GEMM efficiency
    attention_flops = 989.5e12 * 0.45
    bandwidth = 3350e9 * 0.75
    linear_flops = 2 * patches * layers * (4 * h * h + 2 * h * i) + 2 * tokens * h * 3840
    attention_pair_flops = 4 * layers * h * patches * patches
    elementwise_bytes = patches * layers * (10 * h + 2 * i) * 2  # norms, adds, GELU in bf16
    launches = (layers * KERNELS_PER_ENCODER_LAYER + KERNELS_OUTSIDE_ENCODER_LAYERS) * 3e-6
    expected = (linear_flops / gemm_flops + attention_pair_flops / attention_flops + elementwise_bytes / bandwidth
                + launches)
    seconds = encoder_cost("gemma-3-12b").time(*one_image(256))
    assert seconds == pytest.approx(expected, rel=1e-9)
    assert 5e-3 < seconds < 20e-3  # about 12 ms: ~5.5 TFLOP per image


def test_small_image_is_bound_by_reading_the_weights():
    """64 tokens (256 patches) of Qwen2-VL: fewer rows than the ridge point, so the weights' read sets the linear
    layers' time."""
    cost = encoder_cost("qwen2-vl-7b")
    parameters = 32 * (4 * 1280 * 1280 + 2 * 1280 * 5120) + 5120 * 5120 + 5120 * 3584  # tower and merger
    weight_read = parameters * 2 / (3350e9 * 0.75)
    assert cost.weight_read_s == pytest.approx(weight_read)
    assert cost.component_times(*one_image(64))["linear_layers"] > weight_read
    assert 64 * cost.linear_compute_s_per_token < weight_read


def test_no_encoder_tokens_cost_nothing():
    cost = encoder_cost("llava-1.5-7b", "a100-80gb")
    assert cost.time(0, 0) == 0.0
    assert set(cost.component_times(0, 0).values()) == {0.0}


def test_time_grows_with_tokens():
    cost = encoder_cost("qwen2-vl-7b")
    one_image_times = [cost.time(*one_image(tokens)) for tokens in (1, 16, 64, 256, 1024, 4096)]
    assert one_image_times == sorted(one_image_times) and len(set(one_image_times)) == len(one_image_times)
    images_of_256 = [cost.time(count * 256, count * 256 * 256) for count in range(1, 6)]
    assert images_of_256 == sorted(images_of_256) and len(set(images_of_256)) == len(images_of_256)


def test_one_large_image_costs_more_attention_than_several_small_ones():
    cost = encoder_cost("qwen2-vl-7b")
    one_large = cost.component_times(1024, 1024 * 1024)
    four_small = cost.component_times(1024, 4 * 256 * 256)
    assert one_large["attention"] == pytest.approx(4 * four_small["attention"])  # quadratic in an image's size
    assert one_large["linear_layers"] == four_small["linear_layers"]  # linear in the tokens in all
    assert cost.time(1024, 1024 * 1024) > cost.time(1024, 4 * 256 * 256)


def test_tensor_parallelism_splits_compute_and_weights():
    one, two = encoder_cost("gemma-3-12b"), encoder_cost("gemma-3-12b", tensor_parallel_size=2)
    assert two.linear_compute_s_per_token == pytest.approx(one.linear_compute_s_per_token / 2)
    assert two.attention_s_per_work == pytest.approx(one.attention_s_per_work / 2)
    assert two.weight_read_s == pytest.approx(one.weight_read_s / 2)
    with pytest.raises(ValueError, match="vision_encoder: tensor_parallel_size 3 must divide"):
        encoder_cost("gemma-3-12b", tensor_parallel_size=3)


# --- in the analytical model -----------------------------------------------------------------------------------

BATCHES = [
    StepBatch([512], [0]),                       # a prompt chunk
    StepBatch([1, 1, 1], [100, 2000, 40]),       # decodes
    StepBatch([300, 1, 1], [256, 900, 77]),      # mixed
]


def test_a_step_without_encoder_tokens_keeps_its_time_to_the_last_bit():
    model = AnalyticalCostModel(resolve_model("gemma-3-12b"), H100)
    before = [model.step_time(batch) for batch in BATCHES]
    model.price_vision(resolve_vision_encoder("gemma-3-12b", None))
    assert [model.step_time(batch) for batch in BATCHES] == before
    assert [model.step_time(replace(batch, encoder_input_lengths=[])) for batch in BATCHES] == before


def test_a_step_that_encodes_images_adds_the_encoders_time():
    model = AnalyticalCostModel(resolve_model("qwen2-vl-7b"), H100)
    plain = StepBatch([700, 1], [0, 50])
    without = model.step_time(plain)
    model.price_vision(resolve_vision_encoder("qwen2-vl-7b", None))
    with_images = replace(plain, encoder_input_lengths=[400, 300])
    features = step_features(with_images)
    assert (features.num_encoder_tokens, features.encoder_attention_work) == (700, 400 ** 2 + 300 ** 2)
    assert model.step_time(with_images) == pytest.approx(without + model.vision.time(700, 400 ** 2 + 300 ** 2))
    assert model.describe()["vision_encoder"]["encoder"]["name"] == "qwen2-vl-vit"
    assert model.describe()["vision_encoder"]["one_image_s"] is None  # dynamic resolution


def test_async_scheduling_times_the_encoder_in_its_stage():
    # Async scheduling times a step stage by stage (one stage here): the encoder's time is in it, not dropped.
    model = AnalyticalCostModel(resolve_model("qwen2-vl-7b"), H100)
    model.price_vision(resolve_vision_encoder("qwen2-vl-7b", None))
    features = step_features(StepBatch([700, 1], [0, 50], encoder_input_lengths=[400, 300]))
    plain = step_features(StepBatch([700, 1], [0, 50]))
    added = sum(model.pipeline_stage_times(features)) - sum(model.pipeline_stage_times(plain))
    assert added == pytest.approx(model.vision.time(700, 400 ** 2 + 300 ** 2))


def test_a_step_with_encoder_tokens_needs_a_priced_encoder():
    model = AnalyticalCostModel(resolve_model("gemma-3-12b"), H100)
    assert "vision_encoder" not in model.describe()
    with pytest.raises(RuntimeError, match="a step encodes 256 multimodal tokens, but no vision encoder was priced"):
        model.step_time(StepBatch([300], [0], encoder_input_lengths=[256]))


def test_the_encoder_is_priced_on_one_pipeline_stage_only():
    model = AnalyticalCostModel(resolve_model("gemma-3-12b"), H100, pipeline_parallel_size=2)
    with pytest.raises(ValueError, match="a vision encoder is priced on one pipeline stage only"):
        model.price_vision(resolve_vision_encoder("gemma-3-12b", None))
    with pytest.raises(RuntimeError, match="no vision encoder was priced"):
        model.step_time(StepBatch([300], [0], encoder_input_lengths=[256]))


def test_an_inline_encoder_prices_like_the_preset_it_copies():
    inline = resolve_vision_encoder("llava-1.5-7b", dict(VISION_ENCODER_PRESETS["clip-vit-l-336"].to_dict()))
    assert isinstance(inline, VisionEncoderShape)
    a100 = resolve_hardware("a100-80gb")
    assert VisionEncoderCost(inline, a100, "float16").time(576, 576 ** 2) == \
        encoder_cost("llava-1.5-7b", "a100-80gb").time(576, 576 ** 2)
