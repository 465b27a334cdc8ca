"""compressed-tensors checkpoints (llm-compressor's format: W4A16 / W8A16 from GPTQ and AWQ, W8A8, FP8): the loader's
dequantized weights equal transformers' (compressed-tensors' own decompression) bit for bit, so the logits do; the
engine generates transformers' tokens; what the format can say and the loader cannot do is refused by key."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.models import load_model, make_test_model
from engine.models.compressed_tensors import unpack_codes
from engine.models.config import ModelConfig
from tests.models.compressed_checkpoints import edit_quantization_config, write_compressed_checkpoint
from tests.models.engine_generation import assert_engine_generates_as_transformers, prompts
from tests.models.test_models_vs_transformers import ATOL, PagedSession, hf_logits

pytest.importorskip("compressed_tensors")

TOKEN_DYNAMIC_INT8 = dict(num_bits=8, type="int", symmetric=True, strategy="token", dynamic=True)
TOKEN_DYNAMIC_FP8 = dict(num_bits=8, type="float", symmetric=True, strategy="token", dynamic=True)
# name: (weights, input activations, storage format), as the llm-compressor presets of the same names store them.
SCHEMES = {
    "w4a16": (dict(num_bits=4, type="int", symmetric=True, strategy="group", group_size=32), None, "pack-quantized"),
    "w4a16_asym": (dict(num_bits=4, type="int", symmetric=False, strategy="group", group_size=32), None,
                   "pack-quantized"),  # AWQ's: zero points, packed along the output rows
    "w2a16": (dict(num_bits=2, type="int", symmetric=True, strategy="group", group_size=16), None, "pack-quantized"),
    "w8a16": (dict(num_bits=8, type="int", symmetric=True, strategy="channel"), None, "pack-quantized"),
    "w8a8_int8": (dict(num_bits=8, type="int", symmetric=True, strategy="channel"), TOKEN_DYNAMIC_INT8,
                  "int-quantized"),
    "fp8_dynamic": (dict(num_bits=8, type="float", symmetric=True, strategy="channel"), TOKEN_DYNAMIC_FP8,
                    "float-quantized"),
    "fp8_tensor": (dict(num_bits=8, type="float", symmetric=True, strategy="tensor"), TOKEN_DYNAMIC_FP8,
                   "float-quantized"),
    # Blocks of 48 over 128 and 64 rows and columns: the last block of each is partial.
    "fp8_block": (dict(num_bits=8, type="float", symmetric=True, strategy="block", block_structure=[48, 48]),
                  TOKEN_DYNAMIC_FP8, "float-quantized"),
}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return make_test_model(tmp_path_factory.mktemp("source"), "llama", seed=11, hidden_size=128,
                           intermediate_size=256)


def _checkpoint(tmp_path, source, name, **options):
    weights, activations, storage = SCHEMES[name]
    return write_compressed_checkpoint(tmp_path / name, source, weights, activations, storage, **options)


@pytest.mark.parametrize("name", list(SCHEMES))
def test_weights_and_logits_equal_transformers_dequantized(tmp_path, source, name):
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    path = _checkpoint(tmp_path, source, name)
    stored = load_file(path / "model.safetensors")
    assert "model.layers.0.mlp.down_proj.weight_scale" in stored  # the checkpoint is quantized, in the library's format
    model, config = load_model(path, torch.float32)
    hf_model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, attn_implementation="eager",
                                                    quantization_config=CompressedTensorsConfig(dequantize=True)).eval()
    ours = dict(model.named_parameters())
    layer = hf_model.model.layers[1]
    torch.testing.assert_close(ours["model.layers.1.mlp.down_proj.weight"], layer.mlp.down_proj.weight, rtol=0, atol=0)
    q_rows = layer.self_attn.q_proj.weight.shape[0]
    torch.testing.assert_close(ours["model.layers.1.self_attn.qkv_proj.weight"][:q_rows], layer.self_attn.q_proj.weight,
                               rtol=0, atol=0)
    original = load_file(source / "model.safetensors")["model.layers.1.mlp.down_proj.weight"]
    assert not torch.equal(ours["model.layers.1.mlp.down_proj.weight"], original)  # quantization moved the weights
    prompts_by_name = {f"r{length}": [(7 * i + length) % 500 + 4 for i in range(length)] for length in (3, 17, 40)}
    logits = PagedSession(model, config).step(prompts_by_name)
    for request, tokens in prompts_by_name.items():
        torch.testing.assert_close(logits[request], hf_logits(hf_model, tokens), atol=ATOL, rtol=0, msg=request)


def test_the_engine_generates_what_transformers_generates(tmp_path, source):
    """AWQ-style asymmetric 4-bit weights through the scheduler with chunked prefill (transformers' compressed path
    cannot load packed zero points, so it dequantizes at load too)."""
    from transformers import CompressedTensorsConfig

    path = _checkpoint(tmp_path, source, "w4a16_asym")
    llm = assert_engine_generates_as_transformers(path, prompts(), max_num_batched_tokens=16, max_model_len=64,
                                                  hf_options={"quantization_config": CompressedTensorsConfig(
                                                      dequantize=True)})
    manager = llm.scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks


def test_the_engine_generates_what_transformers_runs_compressed(tmp_path, source):
    """GPTQ-style symmetric 4-bit weights: transformers keeps them packed and decompresses each on the fly."""
    assert_engine_generates_as_transformers(_checkpoint(tmp_path, source, "w4a16"), prompts(), max_model_len=64)


def test_gptq_group_index_maps_each_column_to_its_group(tmp_path, source):
    """Old GPTQ checkpoints with ``actorder: group`` store ``weight_g_idx``: column k uses group g_idx[k]'s scale."""
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    path = _checkpoint(tmp_path, source, "w4a16")
    edit_quantization_config(path, weights__actorder="group")
    tensors = load_file(path / "model.safetensors")
    columns = 128
    group_index = torch.randperm(columns, generator=torch.Generator().manual_seed(0)) % (columns // 32)
    for name in [name for name in tensors if name.endswith(".weight_packed")]:
        tensors[name.replace("weight_packed", "weight_g_idx")] = group_index.to(torch.int32) if tensors[
            name.replace("weight_packed", "weight_shape")][1] == columns else torch.arange(
            int(tensors[name.replace("weight_packed", "weight_shape")][1]), dtype=torch.int32) // 32
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    model, _ = load_model(path, torch.float32)
    prefix = "model.layers.0.self_attn.o_proj."
    codes = unpack_from_int32(tensors[prefix + "weight_packed"], 4, torch.Size([128, columns]))
    expected = codes.float() * tensors[prefix + "weight_scale"][:, group_index.long()]
    torch.testing.assert_close(dict(model.named_parameters())["model.layers.0.self_attn.o_proj.weight"], expected,
                               rtol=0, atol=0)


def test_unpacking_agrees_with_the_library_for_every_width():
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    for bits in (2, 4, 8):
        codes = torch.randint(-(1 << (bits - 1)), 1 << (bits - 1), (5, 70), dtype=torch.int8,
                              generator=torch.Generator().manual_seed(bits))
        assert torch.equal(unpack_codes(pack_to_int32(codes, bits), bits, 70), codes.int())


def _config(path):
    return json.loads((path / "config.json").read_text())


@pytest.mark.parametrize("changes, message", [
    (dict(input_activations__dynamic=False), "config_groups.group_0.input_activations is static"),
    (dict(weights__type="float", weights__num_bits=4), "float weights of 4 bits are not supported"),
    (dict(weights__strategy="tensor_group"), "weights.strategy 'tensor_group' is not supported"),
    (dict(group__format="marlin-24"), "format 'marlin-24' is not supported"),
    (dict(sparsity_config={"format": "sparse-24-bitmask"}), "quantization_config.sparsity_config is not supported"),
    (dict(weights__num_bits=3), "int weights of 3 bits are not supported"),
])
def test_what_the_loader_cannot_do_is_refused_by_key(tmp_path, source, changes, message):
    path = _checkpoint(tmp_path, source, "w8a8_int8" if "input_activations__dynamic" in changes else "w4a16")
    edit_quantization_config(path, **changes)
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_pretrained(path)


def test_a_quantized_layer_no_group_targets_or_left_incomplete_is_named(tmp_path, source):
    path = _checkpoint(tmp_path, source, "w4a16")
    edit_quantization_config(path, **{"config_groups": {"group_0": {
        **_config(path)["quantization_config"]["config_groups"]["group_0"], "targets": ["re:.*self_attn.*"]}}})
    with pytest.raises(ValueError, match="stores 'model.layers.0.mlp.down_proj' quantized, but no"):
        load_model(path, torch.float32)
    path = _checkpoint(tmp_path / "incomplete", source, "w4a16")
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight_scale"]
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="quantized 'model.layers.1.mlp.up_proj' is incomplete: it has "
                                         r"\['weight_packed', 'weight_shape'\]"):
        load_model(path, torch.float32)


def test_a_mixture_of_experts_checkpoint_dequantizes_every_expert(tmp_path):
    """Qwen3-MoE as llm-compressor stores it (each expert's projections packed, the router left in float): every
    expert's weights equal the library's own decompression of what it packed."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from compressed_tensors.quantization.utils import calculate_qparams

    source = make_test_model(tmp_path / "source", "qwen3_moe", seed=2, num_experts=4, num_experts_per_token=2,
                             moe_intermediate_size=48)
    weights = dict(num_bits=4, type="int", symmetric=False, strategy="group", group_size=16)
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**weights))
    stored, expected = {}, {}
    for name, tensor in load_file(source / "model.safetensors").items():
        if ".experts." not in name and "_proj." not in name or "embed" in name:
            stored[name] = tensor
            continue
        grouped = tensor.unflatten(-1, (-1, 16))
        scale, zero_point = calculate_qparams(grouped.amin(-1), grouped.amax(-1), scheme.weights)
        packed = PackedQuantizationCompressor.compress(
            {"weight": tensor, "weight_scale": scale, "weight_zero_point": zero_point.to(torch.int8)}, scheme)
        expected[name] = PackedQuantizationCompressor.decompress(dict(packed), scheme)["weight"]
        stored.update({f"{name.removesuffix('weight')}{part}": value for part, value in packed.items()})
    path = tmp_path / "moe_w4a16"
    path.mkdir()
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "compressed-tensors", "format": "pack-quantized",
                                     "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}},
                                     "ignore": ["lm_head", "re:.*mlp.gate$"]}
    (path / "config.json").write_text(json.dumps(config))
    save_file(stored, path / "model.safetensors", metadata={"format": "pt"})
    model, _ = load_model(path, torch.float32)
    experts = model.model.layers[1].mlp.experts
    for expert in range(4):
        prefix = f"model.layers.1.mlp.experts.{expert}."
        torch.testing.assert_close(experts.gate_up_proj[expert], torch.cat([expected[prefix + "gate_proj.weight"],
                                                                             expected[prefix + "up_proj.weight"]]),
                                   rtol=0, atol=0)
        torch.testing.assert_close(experts.down_proj[expert], expected[prefix + "down_proj.weight"], rtol=0, atol=0)
