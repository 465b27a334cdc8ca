"""Vision-language checkpoints' own config.json files (Gemma 3, LLaVA-1.5, Qwen2-VL, Qwen2.5-VL): the language
model's shape equals its preset's, the vision encoder equals the preset encoder, malformed vision configs are
refused by key, and a workload whose model: is such a folder finds its encoder."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from sim.engine_setup import SetupError, build_setup
from sim.hf_model_config import model_from_hf_config
from sim.hf_vision_config import language_model_config, vision_encoder_from_hf_config, vision_encoder_from_hf_path
from sim.model_presets import resolve_model
from sim.vision_encoders import VisionEncoderShape, resolve_vision_encoder
from workloads import load_workload_text

# google/gemma-3-12b-it: the text_config leaves vocab_size, head_dim, max_position_embeddings at
# Gemma3TextConfig's defaults.
GEMMA_3_12B_CONFIG = {
    "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999, "eoi_token_index": 256000,
    "eos_token_id": [1, 106], "image_token_index": 262144, "initializer_range": 0.02, "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {"hidden_size": 3840, "intermediate_size": 15360, "model_type": "gemma3_text",
                    "num_attention_heads": 16, "num_hidden_layers": 48, "num_key_value_heads": 8,
                    "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024},
    "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
    "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                      "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
                      "patch_size": 14, "vision_use_head": False},
}
# llava-hf/llava-1.5-7b-hf: the text_config holds a few keys, the rest LlamaConfig's defaults; its _name_or_path
# is the base LM's (Vicuna), not this model.
LLAVA_1_5_7B_CONFIG = {
    "architectures": ["LlavaForConditionalGeneration"], "ignore_index": -100, "image_token_index": 32000,
    "model_type": "llava", "pad_token_id": 32001, "projector_hidden_act": "gelu",
    "text_config": {"_name_or_path": "lmsys/vicuna-7b-v1.5", "architectures": ["LlamaForCausalLM"],
                    "max_position_embeddings": 4096, "model_type": "llama", "rms_norm_eps": 1e-05,
                    "torch_dtype": "float16", "vocab_size": 32064},
    "tie_word_embeddings": False, "torch_dtype": "float16", "transformers_version": "4.36.0.dev0",
    "vision_config": {"hidden_size": 1024, "image_size": 336, "intermediate_size": 4096,
                      "model_type": "clip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 24,
                      "patch_size": 14, "projection_dim": 768, "vocab_size": 32000},
    "vision_feature_layer": -2, "vision_feature_select_strategy": "default", "vocab_size": 32064,
}
# Qwen/Qwen2-VL-7B-Instruct: the LM's keys at the top level; vision_config.hidden_size is the LM's width.
QWEN2_VL_7B_CONFIG = {
    "architectures": ["Qwen2VLForConditionalGeneration"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "vision_start_token_id": 151652, "vision_end_token_id": 151653,
    "vision_token_id": 151654, "image_token_id": 151655, "video_token_id": 151656, "hidden_act": "silu",
    "hidden_size": 3584, "initializer_range": 0.02, "intermediate_size": 18944, "max_position_embeddings": 32768,
    "max_window_layers": 28, "model_type": "qwen2_vl", "num_attention_heads": 28, "num_hidden_layers": 28,
    "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.41.2", "use_cache": True,
    "use_sliding_window": False,
    "vision_config": {"depth": 32, "embed_dim": 1280, "mlp_ratio": 4, "num_heads": 16, "in_chans": 3,
                      "hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2, "spatial_patch_size": 14,
                      "temporal_patch_size": 2},
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}, "vocab_size": 152064,
}
# Qwen/Qwen2.5-VL-7B-Instruct: Qwen2-VL's LM with a 128k context; a SwiGLU ViT with windowed attention.
QWEN2_5_VL_7B_CONFIG = {
    **{key: value for key, value in QWEN2_VL_7B_CONFIG.items() if key != "vision_config"},
    "architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
    "max_position_embeddings": 128000,
    "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420,
                      "num_heads": 16, "in_chans": 3, "out_hidden_size": 3584, "patch_size": 14,
                      "spatial_merge_size": 2, "spatial_patch_size": 14, "window_size": 112,
                      "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2, "temporal_patch_size": 2},
}
# A text model's config (meta-llama/Meta-Llama-3-8B's keys that matter).
LLAMA_3_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
    "max_position_embeddings": 8192, "hidden_act": "silu", "torch_dtype": "bfloat16",
}
VISION_LANGUAGE = [(GEMMA_3_12B_CONFIG, "gemma-3-12b"), (LLAVA_1_5_7B_CONFIG, "llava-1.5-7b"),
                   (QWEN2_VL_7B_CONFIG, "qwen2-vl-7b")]


def write_checkpoint(tmp_path: Path, config: dict, folder: str = "checkpoint") -> Path:
    path = tmp_path / folder
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


def fields_but_name(shape) -> dict:
    return asdict(replace(shape, name="-"))


@pytest.mark.parametrize("config, preset", VISION_LANGUAGE)
def test_the_language_model_of_a_vision_language_config_is_its_preset(tmp_path, config, preset):
    folder = write_checkpoint(tmp_path, config)
    shape = resolve_model(str(folder))
    assert shape.name == "checkpoint"  # not LLaVA's text_config's Vicuna
    assert fields_but_name(shape) == fields_but_name(resolve_model(preset))


@pytest.mark.parametrize("config, preset", VISION_LANGUAGE)
def test_the_vision_encoder_of_a_vision_language_config_is_the_preset_encoder(tmp_path, config, preset):
    folder = write_checkpoint(tmp_path, config)
    encoder = vision_encoder_from_hf_path(str(folder))
    assert encoder == vision_encoder_from_hf_path(str(folder / "config.json"))
    assert encoder.name == "checkpoint vision"
    assert fields_but_name(encoder) == fields_but_name(resolve_vision_encoder(preset, None))


def test_qwen2_5_vl_has_a_gated_vit_and_a_merger_into_out_hidden_size(tmp_path):
    folder = write_checkpoint(tmp_path, QWEN2_5_VL_7B_CONFIG)
    encoder = vision_encoder_from_hf_path(folder)
    assert encoder.gated_mlp and encoder.tokens_per_image is None
    assert (encoder.num_layers, encoder.hidden_size, encoder.intermediate_size, encoder.num_attention_heads,
            encoder.patches_per_token) == (32, 1280, 3420, 16, 4)
    assert encoder.projector_parameters == 5120 * 5120 + 5120 * 3584
    # Windows of 112 pixels: 4 x 4 merged tokens; four layers attend over the whole image. A 1,024-token image's
    # attention: those four over its 1,024 squared token pairs, the other 28 over 16 a token.
    assert (encoder.window_tokens, encoder.full_attention_layers) == (16, 4)
    assert encoder.attention_flops(1024 ** 2, 1024) == 4 * 1280 * 16 * (4 * 1024 ** 2 + 28 * 1024 * 16)
    assert encoder.attention_flops(1024 ** 2, 1024) < replace(encoder, window_tokens=None).attention_flops(1024 ** 2) / 6
    # An image no larger than a window attends over itself in every layer.
    assert encoder.attention_flops(16 * 16, 16) == replace(encoder, window_tokens=None).attention_flops(16 * 16)
    # Its LM: Qwen2-VL-7B's, with a 128k context.
    assert fields_but_name(model_from_hf_config(folder / "config.json")) == fields_but_name(
        replace(resolve_model("qwen2-vl-7b"), max_position_embeddings=128000))


def test_qwen2_vl_keys_saved_under_text_config_read_alike(tmp_path):
    # Newer transformers save the LM's keys under text_config (its model_type qwen2_vl_text).
    lm_keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
               "vocab_size", "max_position_embeddings")
    text_config = {key: QWEN2_VL_7B_CONFIG[key] for key in lm_keys} | {"model_type": "qwen2_vl_text"}
    config = {key: value for key, value in QWEN2_VL_7B_CONFIG.items() if key not in lm_keys}
    folder = write_checkpoint(tmp_path, {**config, "text_config": text_config})
    assert fields_but_name(resolve_model(str(folder))) == fields_but_name(resolve_model("qwen2-vl-7b"))
    assert fields_but_name(vision_encoder_from_hf_path(folder)) == fields_but_name(
        resolve_vision_encoder("qwen2-vl-7b", None))


def test_a_llava_on_mistral_fills_mistral_defaults(tmp_path):
    # BakLLaVA's layout: LLaVA around a Mistral-7B whose text_config leaves the widths at MistralConfig's defaults.
    text_config = {"_name_or_path": "mistralai/Mistral-7B-v0.1", "architectures": ["MistralForCausalLM"],
                   "model_type": "mistral", "rms_norm_eps": 1e-05, "vocab_size": 32064}
    folder = write_checkpoint(tmp_path, {**LLAVA_1_5_7B_CONFIG, "text_config": text_config})
    shape = resolve_model(str(folder))
    assert fields_but_name(shape) == fields_but_name(replace(resolve_model("mistral-7b"), vocab_size=32064,
                                                             max_position_embeddings=4096 * 32))
    # The projector maps into Mistral's width, 4096 as Llama-2's: the LLaVA-1.5 encoder again.
    assert fields_but_name(vision_encoder_from_hf_path(folder)) == fields_but_name(
        resolve_vision_encoder("llava-1.5-7b", None))


def test_a_llava_feature_layer_and_select_strategy_decide_layers_and_tokens(tmp_path):
    config = {**LLAVA_1_5_7B_CONFIG, "vision_feature_layer": 12, "vision_feature_select_strategy": "full"}
    encoder = vision_encoder_from_hf_config(config, 4096, tmp_path / "config.json")
    assert (encoder.num_layers, encoder.tokens_per_image) == (12, 577)  # the CLS patch kept
    config = {**LLAVA_1_5_7B_CONFIG, "vision_feature_layer": [-2, -5]}
    encoder = vision_encoder_from_hf_config(config, 4096, tmp_path / "config.json")
    # The deepest layer read decides how many run; the features of both are concatenated into the projector.
    assert encoder.num_layers == 23 and encoder.projector_parameters == 2 * 1024 * 4096 + 4096 * 4096


def test_a_text_only_config_has_neither(tmp_path):
    folder = write_checkpoint(tmp_path, LLAMA_3_8B_CONFIG)
    assert language_model_config(LLAMA_3_8B_CONFIG, folder) is None
    assert vision_encoder_from_hf_config(LLAMA_3_8B_CONFIG, 4096, folder) is None
    assert vision_encoder_from_hf_path(folder) is None
    assert fields_but_name(resolve_model(str(folder))) == fields_but_name(resolve_model("llama-3-8b"))
    # Not a path at all (a preset's name), or a folder without a config.json: no encoder either.
    assert vision_encoder_from_hf_path("gemma-3-12b") is None
    assert vision_encoder_from_hf_path(tmp_path) is None


def vision_config_with(config: dict, **changes) -> dict:
    """``config`` with its vision_config's keys changed (a value None: the key left out)."""
    vision = {key: value for key, value in config["vision_config"].items() if changes.get(key, 0) is not None}
    return {**config, "vision_config": vision | {key: value for key, value in changes.items() if value is not None}}


@pytest.mark.parametrize("config, message", [
    (vision_config_with(GEMMA_3_12B_CONFIG, patch_size=None), "vision_config lacks the key 'patch_size'"),
    (vision_config_with(GEMMA_3_12B_CONFIG, patch_size=15), "key 'vision_config.patch_size' .* must divide"),
    ({**GEMMA_3_12B_CONFIG, "mm_tokens_per_image": 300}, "key 'mm_tokens_per_image'"),
    ({**GEMMA_3_12B_CONFIG, "vision_config": [1152]}, "key 'vision_config' must be a mapping"),
    ({key: value for key, value in GEMMA_3_12B_CONFIG.items() if key != "vision_config"},
     "lacks the key 'vision_config'"),
    (vision_config_with(LLAVA_1_5_7B_CONFIG, num_hidden_layers="24"),
     "key 'vision_config.num_hidden_layers' must be a positive integer"),
    ({**LLAVA_1_5_7B_CONFIG, "vision_feature_layer": -30}, "key 'vision_feature_layer'"),
    ({**LLAVA_1_5_7B_CONFIG, "vision_feature_select_strategy": "cls"}, "key 'vision_feature_select_strategy'"),
    (vision_config_with(QWEN2_VL_7B_CONFIG, mlp_ratio=None), "vision_config lacks the key 'mlp_ratio'"),
    (vision_config_with(QWEN2_VL_7B_CONFIG, embed_dim=0), "key 'vision_config.embed_dim'"),
    (vision_config_with(QWEN2_5_VL_7B_CONFIG, out_hidden_size=None), "vision_config lacks the key 'out_hidden_size'"),
])
def test_a_malformed_vision_config_names_the_key(tmp_path, config, message):
    folder = write_checkpoint(tmp_path, config)
    with pytest.raises(ValueError, match=f"^model: .*{message}"):
        vision_encoder_from_hf_path(folder)
    resolve_model(str(folder))  # the language model reads all the same: a text-only workload runs


@pytest.mark.parametrize("config, message", [
    ({**LLAVA_1_5_7B_CONFIG, "text_config": {"model_type": "qwen2"}}, "key 'text_config.model_type' is 'qwen2'"),
    ({**GEMMA_3_12B_CONFIG, "text_config": "gemma3_text"}, "key 'text_config' must be a mapping"),
    ({**LLAVA_1_5_7B_CONFIG, "architectures": ["Idefics3ForConditionalGeneration"], "model_type": "idefics3"},
     "is not supported; .*vision-language .*LlavaForConditionalGeneration"),
])
def test_a_language_model_not_read_is_refused_by_name(tmp_path, config, message):
    with pytest.raises(ValueError, match=f"^model: .*{message}"):
        resolve_model(str(write_checkpoint(tmp_path, config)))


WORKLOAD = """
name: images
seed: 1
model: {model}
hardware: h100-sxm
engine: {{max_num_seqs: 16, max_num_batched_tokens: 2048, max_model_len: 8192}}
workload:
  num_requests: 10
  arrival: {{type: poisson, rate: 4}}
  prompt_len: {{type: uniform, min: 50, max: 200}}
  output_len: {{type: constant, value: 8}}
  images: {{fraction: 1.0, count: {{type: constant, value: 1}}}}
"""


def test_a_workload_whose_model_is_a_gemma_3_folder_finds_its_encoder(tmp_path):
    folder = write_checkpoint(tmp_path, GEMMA_3_12B_CONFIG, "gemma-3-12b-it")
    setup = build_setup(load_workload_text(WORKLOAD.format(model=folder)))
    assert setup.vision.encoder.name == "gemma-3-12b-it vision"
    assert fields_but_name(setup.vision.encoder) == fields_but_name(resolve_vision_encoder("gemma-3-12b", None))
    # Each image is the encoder's 256 tokens (the workload sets no tokens_per_image).
    assert {tokens for spec in setup.requests for _, _, tokens in spec.images} == {256}
    # Its image tokens attend each other both ways: each image is prefilled in one chunk, as vLLM does.
    assert setup.vision.encoder.images_whole and setup.scheduler_config.disable_chunked_mm_input
    # A vision_encoder the workload names wins over the config's.
    setup = build_setup(load_workload_text(WORKLOAD.format(model=folder) + "vision_encoder: clip-vit-l-336\n"))
    assert setup.vision.encoder.name == "clip-vit-l-336"


def test_a_malformed_vision_config_refuses_the_workload_naming_model(tmp_path):
    folder = write_checkpoint(tmp_path, vision_config_with(GEMMA_3_12B_CONFIG, image_size=None))
    with pytest.raises(SetupError, match="^model: .*vision_config lacks the key 'image_size'"):
        build_setup(load_workload_text(WORKLOAD.format(model=folder)))


def test_a_text_checkpoint_with_images_still_needs_an_encoder_named(tmp_path):
    folder = write_checkpoint(tmp_path, LLAMA_3_8B_CONFIG)
    with pytest.raises(SetupError, match="model 'checkpoint' has no vision encoder"):
        build_setup(load_workload_text(WORKLOAD.format(model=folder)))
    assert isinstance(build_setup(load_workload_text(WORKLOAD.format(model=folder) + "vision_encoder: clip-vit-l-336\n"
                                                     )).vision.encoder, VisionEncoderShape)


def _encoder_of_a_checkpoint_priced_as_the_engine_loads_it(path):
    """The vision encoder of a checkpoint transformers wrote, once its language model's shape is checked to price
    the parameters of the engine's model of it (within the few norms the shape leaves out)."""
    import torch

    from engine.models import load_model

    shape = model_from_hf_config(path / "config.json")
    model, _ = load_model(path, torch.float32)
    assert shape.num_parameters == pytest.approx(sum(p.numel() for p in model.parameters()), rel=0.01)
    return vision_encoder_from_hf_path(path)


def test_mistral3_reads_its_mistral_language_model_and_pixtral(tmp_path):
    """Mistral Small 3.1's layout, written by transformers: the engine's language model's parameters, and a gated
    Pixtral ViT whose merger takes 2 x 2 patches a token."""
    pytest.importorskip("transformers")
    from tests.models.test_multimodal_text import _mistral3

    path = _mistral3(tmp_path / "mistral3")
    encoder = _encoder_of_a_checkpoint_priced_as_the_engine_loads_it(path)
    assert (encoder.num_layers, encoder.hidden_size, encoder.patches_per_token, encoder.tokens_per_image,
            encoder.gated_mlp) == (1, 32, 4, None, True)
    assert encoder.projector_parameters == 32 * 4 * 32 + 32 * 64 + 64 * 64


def test_qwen3_vl_reads_its_qwen3_language_model_and_a_vit_with_deepstack_mergers(tmp_path):
    """Qwen3-VL's layout, written by transformers: the engine's language model's parameters; a plain-MLP ViT whose
    merger and DeepStack mergers (one here) take 2 x 2 patches a token: within the few norms and biases of
    transformers' own vision tower's parameter count."""
    pytest.importorskip("transformers")
    from transformers import Qwen3VLForConditionalGeneration

    from tests.models.test_multimodal_text import _qwen3_vl

    path = _qwen3_vl(tmp_path / "qwen3_vl")
    encoder = _encoder_of_a_checkpoint_priced_as_the_engine_loads_it(path)
    assert (encoder.num_layers, encoder.hidden_size, encoder.intermediate_size, encoder.patches_per_token,
            encoder.tokens_per_image, encoder.gated_mlp) == (1, 32, 64, 4, None, False)
    merger = 128 * 128 + 128 * 64
    assert encoder.projector_parameters == 2 * merger  # the merger and one DeepStack merger
    visual = Qwen3VLForConditionalGeneration.from_pretrained(str(path)).model.visual
    # The tower's matmuls and the mergers; transformers' count adds the patch embedding, position embeddings,
    # norms and biases, which the shape leaves out.
    transformers_linear = sum(parameter.numel() for name, parameter in visual.named_parameters()
                              if name.endswith("weight") and parameter.dim() == 2 and "embed" not in name)
    assert encoder.vision_tower_parameters + encoder.projector_parameters == transformers_linear


def test_the_qwen3_vl_8b_preset_counts_the_published_parameters():
    # Qwen/Qwen3-VL-8B-Instruct: 8,767,123,696 parameters; the shapes leave out embeddings of patches and positions,
    # norms and biases.
    encoder = resolve_vision_encoder("qwen3-vl-8b", None)
    total = resolve_model("qwen3-vl-8b").num_parameters + encoder.num_parameters
    assert total / 1e9 == pytest.approx(8.767, rel=0.003)
    assert encoder == resolve_vision_encoder("x", "qwen3-vl-vit")


def test_a_qwen3_vl_moe_config_reads_its_experts(tmp_path):
    # Qwen/Qwen3-VL-30B-A3B-Instruct's keys that matter: Qwen3-30B-A3B's language model and Qwen3-VL's ViT.
    text = {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 48, "num_attention_heads": 32,
            "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 262144,
            "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768, "decoder_sparse_step": 1,
            "mlp_only_layers": [], "model_type": "qwen3_vl_moe_text", "hidden_act": "silu",
            "rope_scaling": {"rope_type": "default", "mrope_section": [24, 20, 20], "mrope_interleaved": True}}
    vision = {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16, "out_hidden_size": 2048,
              "spatial_merge_size": 2, "patch_size": 16, "deepstack_visual_indexes": [8, 16, 24],
              "hidden_act": "gelu_pytorch_tanh"}
    folder = write_checkpoint(tmp_path, {"architectures": ["Qwen3VLMoeForConditionalGeneration"],
                                         "model_type": "qwen3_vl_moe", "tie_word_embeddings": False,
                                         "text_config": text, "vision_config": vision})
    shape = resolve_model(str(folder))
    assert (shape.num_experts, shape.num_experts_per_token, shape.moe_intermediate_size) == (128, 8, 768)
    qwen3_30b = resolve_model("qwen3-30b-a3b")
    assert shape.num_parameters == pytest.approx(qwen3_30b.num_parameters, rel=0.01)
    encoder = vision_encoder_from_hf_path(folder)
    assert encoder.projector_parameters == 4 * (4608 * 4608 + 4608 * 2048)
    bad = write_checkpoint(tmp_path, {"architectures": ["Qwen3VLForConditionalGeneration"], "text_config": text,
                                      "vision_config": {**vision, "deepstack_visual_indexes": 3}}, "bad")
    with pytest.raises(ValueError, match="deepstack_visual_indexes"):
        vision_encoder_from_hf_path(bad)


# In the shape of OpenGVLab/InternVL3-1B-hf: a Qwen2 language model, InternViT-300M over 448-pixel tiles.
INTERNVL3_1B_CONFIG = {
    "architectures": ["InternVLForConditionalGeneration"], "model_type": "internvl", "downsample_ratio": 0.5,
    "image_token_id": 151667, "image_seq_length": 256, "projector_hidden_act": "gelu",
    "text_config": {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                    "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151674,
                    "max_position_embeddings": 32768},
    "vision_config": {"model_type": "internvl_vision", "hidden_size": 1024, "intermediate_size": 4096,
                      "num_hidden_layers": 24, "num_attention_heads": 16, "image_size": [448, 448],
                      "patch_size": [14, 14]},
}


def test_an_internvl_config_gives_its_qwen2_and_internvit_attending_per_tile(tmp_path):
    folder = write_checkpoint(tmp_path, INTERNVL3_1B_CONFIG, "internvl3-1b")
    language = language_model_config(INTERNVL3_1B_CONFIG, folder)
    assert language["architectures"] == ["Qwen2ForCausalLM"] and language["hidden_size"] == 896
    encoder = vision_encoder_from_hf_path(folder)
    # 32 x 32 patches a tile, shuffled 2 x 2: 256 tokens a tile, each tile a window of attention.
    assert (encoder.patches_per_token, encoder.window_tokens, encoder.tokens_per_image) == (4, 256, None)
    assert encoder.projector_parameters == 4096 * 896 + 896 * 896
    setup = build_setup(load_workload_text(WORKLOAD.format(model=folder), overrides=[
        "workload.images.tokens_per_image={type: constant, value: 1280}"]))
    assert setup.vision.encoder.name == "internvl3-1b vision" and not setup.scheduler_config.disable_chunked_mm_input
    with pytest.raises(ValueError, match="key 'downsample_ratio' must be 1 / n"):
        vision_encoder_from_hf_config({**INTERNVL3_1B_CONFIG, "downsample_ratio": 0.3}, 896, folder)


def test_a_llava_next_config_is_llava_over_tiles_of_any_resolution(tmp_path):
    """LLaVA-1.6 keeps LLaVA-1.5's keys, adds the tiles' pinpoints: its images' tokens follow their size (the workload
    states them), each tile attending within itself."""
    config = {**LLAVA_1_5_7B_CONFIG, "architectures": ["LlavaNextForConditionalGeneration"], "model_type": "llava_next",
              "image_grid_pinpoints": [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]}
    folder = write_checkpoint(tmp_path, config, "llava-v1.6")
    encoder = vision_encoder_from_hf_path(folder)
    llava = resolve_vision_encoder("llava-1.5-7b", None)
    assert fields_but_name(encoder) == fields_but_name(replace(llava, tokens_per_image=None, window_tokens=576))
    assert fields_but_name(resolve_model(str(folder))) == fields_but_name(resolve_model("llava-1.5-7b"))
    with pytest.raises(ValueError, match="must be 'default' for LLaVA-NeXT"):
        vision_encoder_from_hf_config({**config, "vision_feature_select_strategy": "full"}, 4096, folder)


def test_a_llava_onevision_config_is_a_qwen2_behind_siglip_tiles(tmp_path):
    """In the shape of llava-onevision-qwen2-0.5b-ov-hf: SigLIP at 384 pixels (27 x 27 patches a tile), its last
    layer read, a Qwen2 language model."""
    config = {"architectures": ["LlavaOnevisionForConditionalGeneration"], "model_type": "llava_onevision",
              "image_token_index": 151646, "vision_aspect_ratio": "anyres_max_9",
              "image_grid_pinpoints": [[384, 384], [384, 768], [768, 384]],
              "text_config": {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
                              "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
                              "vocab_size": 152000},
              "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152, "intermediate_size": 4304,
                                "num_hidden_layers": 26, "num_attention_heads": 16, "image_size": 384,
                                "patch_size": 14}}
    folder = write_checkpoint(tmp_path, config, "llava-onevision")
    assert resolve_model(str(folder)).hidden_size == 896
    encoder = vision_encoder_from_hf_path(folder)
    assert (encoder.num_layers, encoder.window_tokens, encoder.tokens_per_image) == (26, 729, None)
    assert encoder.projector_parameters == 1152 * 896 + 896 * 896
