"""Checkpoint loading: single file and shards, dtypes, fused-weight remapping, and clear errors."""

import json
import re

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.models import (LlamaForCausalLM, ModelConfig, Qwen2ForCausalLM, load_model, make_test_model,
                           supported_architectures)
from engine.models.loader import resolve_dtype
from engine.runner.attention import allocate_kv_caches, build_attention_metadata, compute_positions


@pytest.fixture(scope="module")
def qwen_path(tmp_path_factory):
    return make_test_model(tmp_path_factory.mktemp("qwen"), "qwen2", seed=3)


def _prefill_logits(model, config, tokens):
    caches = allocate_kv_caches(config.num_hidden_layers, 8, 16, config.num_key_value_heads, config.head_dim,
                                next(model.parameters()).dtype, "cpu")
    metadata = build_attention_metadata([0], [len(tokens)], [[5, 2, 7]], 16)
    with torch.no_grad():
        hidden = model(torch.tensor(tokens), compute_positions([0], [len(tokens)]), caches, metadata)
        return model.compute_logits(hidden)


def test_fused_weights_hold_the_checkpoint_projections(qwen_path):
    model, config = load_model(qwen_path, torch.float32, "cpu")
    assert isinstance(model, Qwen2ForCausalLM) and not model.training
    weights = load_file(str(qwen_path / "model.safetensors"))
    attn = model.model.layers[1].self_attn
    q, k, v = attn.qkv_proj.weight.split([attn.q_size, attn.kv_size, attn.kv_size])
    assert torch.equal(q, weights["model.layers.1.self_attn.q_proj.weight"])
    assert torch.equal(v, weights["model.layers.1.self_attn.v_proj.weight"])
    assert torch.equal(attn.qkv_proj.bias[attn.q_size:attn.q_size + attn.kv_size],
                       weights["model.layers.1.self_attn.k_proj.bias"])
    assert attn.o_proj.bias is None
    gate, up = model.model.layers[0].mlp.gate_up_proj.weight.chunk(2)
    assert torch.equal(up, weights["model.layers.0.mlp.up_proj.weight"])
    assert not any(p.requires_grad for p in model.parameters())


def test_sharded_checkpoint_loads_like_the_single_file(qwen_path, tmp_path):
    weights = load_file(str(qwen_path / "model.safetensors"))
    names = sorted(weights)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    weight_map = {}
    for file, shard_names in shards.items():
        save_file({n: weights[n] for n in shard_names}, str(tmp_path / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in shard_names})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (tmp_path / "config.json").write_text((qwen_path / "config.json").read_text())

    sharded, config = load_model(tmp_path, "float32", "cpu")
    single, _ = load_model(qwen_path, "float32", "cpu")
    tokens = [5, 9, 100, 42, 7]
    assert torch.equal(_prefill_logits(sharded, config, tokens), _prefill_logits(single, config, tokens))


def test_missing_shard_and_missing_weight_are_errors(qwen_path, tmp_path):
    (tmp_path / "config.json").write_text((qwen_path / "config.json").read_text())
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"model.norm.weight": "model-00001-of-00001.safetensors"}}))
    with pytest.raises(FileNotFoundError, match="model-00001-of-00001"):
        load_model(tmp_path)

    (tmp_path / "model.safetensors.index.json").unlink()
    weights = load_file(str(qwen_path / "model.safetensors"))
    del weights["model.layers.0.self_attn.k_proj.weight"]
    save_file(weights, str(tmp_path / "model.safetensors"))
    # Named as the checkpoint names it, not by the fused parameter it fills.
    with pytest.raises(ValueError, match=r"missing 1 weight.*'model.layers.0.self_attn.k_proj.weight'"):
        load_model(tmp_path)


def test_no_weights_at_all_is_an_error(qwen_path, tmp_path):
    (tmp_path / "config.json").write_text((qwen_path / "config.json").read_text())
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_model(tmp_path)


def test_unsupported_architecture_names_it(qwen_path, tmp_path):
    config = json.loads((qwen_path / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="GPT2LMHeadModel.*Cohere2ForCausalLM, CohereForCausalLM, DeepseekV2ForCausalLM"):
        load_model(tmp_path)
    # The *Model names are checkpoints of the decoder alone, which only an embedding engine loads; the
    # *ForSequenceClassification ones classify, in a pooling engine too.
    assert supported_architectures() == ["Cohere2ForCausalLM", "CohereForCausalLM", "DeepseekV2ForCausalLM",
                                         "DeepseekV3ForCausalLM", "Ernie4_5ForCausalLM", "Exaone4ForCausalLM",
                                         "Gemma2ForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration",
                                         "Glm4ForCausalLM", "Glm4MoeForCausalLM", "GlmForCausalLM",
                                         "GptOssForCausalLM", "GraniteForCausalLM", "HunYuanDenseV1ForCausalLM",
                                         "InternLM3ForCausalLM", "InternVLForConditionalGeneration",
                                         "Llama4ForCausalLM",
                                         "Llama4ForConditionalGeneration", "LlamaForCausalLM",
                                         "LlamaForSequenceClassification", "LlamaModel",
                                         "LlavaForConditionalGeneration", "LlavaNextForConditionalGeneration",
                                         "LlavaOnevisionForConditionalGeneration",
                                         "Mistral3ForConditionalGeneration",
                                         "MistralForCausalLM", "MistralForSequenceClassification", "MistralModel",
                                         "MixtralForCausalLM", "Olmo2ForCausalLM", "Olmo3ForCausalLM",
                                         "Phi3ForCausalLM", "Qwen2ForCausalLM", "Qwen2ForSequenceClassification",
                                         "Qwen2Model", "Qwen2MoeForCausalLM", "Qwen2VLForConditionalGeneration",
                                         "Qwen2_5_VLForConditionalGeneration", "Qwen3ForCausalLM",
                                         "Qwen3ForSequenceClassification", "Qwen3Model", "Qwen3MoeForCausalLM",
                                         "Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration",
                                         "SeedOssForCausalLM",
                                         "SmolLM3ForCausalLM", "Starcoder2ForCausalLM"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, "bf16"])
def test_half_precision_loads_and_tracks_fp32(qwen_path, dtype):
    model, config = load_model(qwen_path, dtype, "cpu")
    expected_dtype = torch.bfloat16 if dtype == "bf16" else dtype
    assert all(p.dtype == expected_dtype for p in model.parameters())
    reference, _ = load_model(qwen_path, torch.float32, "cpu")
    tokens = list(range(10, 30))
    low = _prefill_logits(model, config, tokens).float()
    high = _prefill_logits(reference, config, tokens)
    assert low.dtype == torch.float32 and torch.isfinite(low).all()
    torch.testing.assert_close(low, high, atol=2e-2, rtol=0)


def test_dtype_resolution(qwen_path):
    config = ModelConfig.from_pretrained(qwen_path)
    assert resolve_dtype("auto", config) == torch.float32  # the checkpoint's torch_dtype
    assert resolve_dtype("half", config) == torch.float16
    with pytest.raises(ValueError, match="int8"):
        resolve_dtype("int8", config)


def test_config_accepts_both_rope_spellings():
    base = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 10, "hidden_size": 8,
            "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2}
    scaling = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    old = ModelConfig.from_dict({**base, "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", **scaling}})
    new = ModelConfig.from_dict({**base, "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0,
                                                              **scaling}})
    assert old.rope_theta == new.rope_theta == 500000.0
    assert old.rope_scaling == new.rope_scaling and old.rope_scaling["rope_type"] == "llama3"
    plain = ModelConfig.from_dict({**base, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}})
    assert plain.rope_scaling is None and plain.rope_theta == 1e6
    assert (plain.num_key_value_heads, plain.head_dim) == (2, 4)
    with pytest.raises(ValueError, match="unsupported rope_scaling type 'dynamic'"):
        LlamaForCausalLM(ModelConfig.from_dict({**base, "rope_scaling": {"type": "dynamic", "factor": 2.0}}))
    # YaRN's original context defaults to max_position_embeddings (the model type's default when absent).
    yarn = ModelConfig.from_dict({**base, "rope_scaling": {"type": "yarn", "factor": 2.0}})
    assert yarn.rope_scaling == {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 2048}
    with pytest.raises(ValueError, match="rope scaling of type 'yarn' needs 'factor'"):
        ModelConfig.from_dict({**base, "rope_scaling": {"type": "yarn"}})
    with pytest.raises(ValueError, match="missing required field 'vocab_size'"):
        ModelConfig.from_dict({k: v for k, v in base.items() if k != "vocab_size"})
    # Hunyuan's dynamic type with an alpha is a fixed stretch of the base (NTK-alpha); without one, refused by name.
    hunyuan = {**base, "architectures": ["HunYuanDenseV1ForCausalLM"], "model_type": "hunyuan_v1_dense"}
    stretched = ModelConfig.from_dict({**hunyuan, "rope_scaling": {"type": "dynamic", "alpha": 1000.0, "factor": 1.0}})
    assert stretched.rope_scaling is None and stretched.rope_theta == pytest.approx(10000.0 * 1000.0 ** (4 / 2))
    with pytest.raises(ValueError, match="rope_scaling type 'dynamic' needs a positive alpha"):
        ModelConfig.from_dict({**hunyuan, "rope_scaling": {"type": "dynamic", "factor": 2.0}})


def test_a_mistral_sliding_window_is_attended_not_a_length_cap(tmp_path):
    path = make_test_model(tmp_path, "mistral")
    config = json.loads((path / "config.json").read_text())
    config["sliding_window"] = 256
    (path / "config.json").write_text(json.dumps(config))
    model, loaded = load_model(path)
    assert model.max_model_len_limit == loaded.max_position_embeddings
    assert all(layer.self_attn.sliding_window == 256 for layer in model.model.layers)


def test_qwen2_sliding_layers_from_max_window_layers(qwen_path, tmp_path):
    config = json.loads((qwen_path / "config.json").read_text())
    config.update(use_sliding_window=True, sliding_window=128, max_window_layers=1)
    config.pop("layer_types", None)  # written by transformers 5 from the original flags: all full attention
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes((qwen_path / "model.safetensors").read_bytes())
    model, loaded = load_model(tmp_path)
    windows = [layer.self_attn.sliding_window for layer in model.model.layers]
    assert windows == [None] + [128] * (loaded.num_hidden_layers - 1) and loaded.sliding_window_fraction == 0.5


BASE = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 10, "hidden_size": 64,
        "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 16}


def config_of(model_type: str, **changes) -> ModelConfig:
    architecture = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
    raw = {**BASE, "model_type": model_type, "architectures": [architecture.get(model_type, "GPT2LMHeadModel")]}
    for key, value in changes.items():
        if value is ...:
            raw.pop(key, None)  # the key absent, as opposed to an explicit null
        else:
            raw[key] = value
    return ModelConfig.from_dict(raw)


def test_keys_a_config_omits_take_transformers_defaults_per_architecture():
    """An absent key is not a null one: transformers' Mistral and Qwen2 configs default the window to 4096
    and the KV heads to 8 and 32; an explicit null means no window and as many KV heads as heads."""
    assert config_of("mistral").sliding_window == 4096
    assert config_of("mistral", sliding_window=None).sliding_window is None
    assert config_of("llama").sliding_window is None
    assert config_of("mistral").num_key_value_heads == 8
    assert config_of("qwen2", num_attention_heads=32).num_key_value_heads == 32
    assert config_of("mistral", num_key_value_heads=None).num_key_value_heads == 16
    assert config_of("llama").num_key_value_heads == 16
    assert config_of("mistral").layer_sliding_windows == (4096,) and config_of("mistral").sliding_window_fraction == 1
    # Llama ignores a window key, as transformers' Llama does.
    assert config_of("llama", sliding_window=64).layer_sliding_windows == (None,)
    # Qwen2 with use_sliding_window and no window key: transformers' 4096 window.
    qwen2 = config_of("qwen2", use_sliding_window=True, max_window_layers=0, num_key_value_heads=4)
    assert (qwen2.sliding_window, qwen2.layer_sliding_windows) == (4096, (4096,))
    # Which layers slide is transformers' rule: from max_window_layers (28) on, or as layer_types list them.
    assert config_of("qwen2", use_sliding_window=True, num_key_value_heads=4).sliding_window is None
    assert config_of("qwen2", use_sliding_window=True, num_key_value_heads=4, max_window_layers=0,
                     layer_types=["full_attention"]).sliding_window is None
    assert config_of("qwen2", use_sliding_window=True, num_key_value_heads=4,
                     layer_types=["sliding_attention"]).layer_sliding_windows == (4096,)
    # Listed sliding layers without use_sliding_window: transformers drops the window they would need.
    with pytest.raises(ValueError, match="sliding_attention layers but use_sliding_window is not true"):
        config_of("qwen2", num_key_value_heads=4, layer_types=["sliding_attention"])
    with pytest.raises(ValueError, match="layer_types must list"):
        config_of("qwen2", num_key_value_heads=4, use_sliding_window=True, layer_types=["sliding", "full"])
    with pytest.raises(ValueError, match="sliding_window must be a positive integer or null, got 0"):
        config_of("mistral", sliding_window=0)
    # Mistral has no biases in transformers, whatever the config says; swish is SiLU.
    mistral = config_of("mistral", attention_bias=True, mlp_bias=True)
    assert (mistral.attention_bias, mistral.mlp_bias) == (False, False)
    LlamaForCausalLM(config_of("llama", hidden_act="swish"))


@pytest.mark.parametrize("changes, message", [
    ({"quantization_config": {"quant_method": "fbgemm_fp8"}}, r"quantization_config \(quant_method 'fbgemm_fp8'\) is not supported"),
    ({"rope_scaling": {"type": "linear"}}, r"rope scaling of type 'linear' needs 'factor'"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0}},
     r"type 'llama3' needs 'low_freq_factor'"),
])
def test_configs_that_would_be_another_model_are_refused_by_key(changes, message):
    with pytest.raises(ValueError, match=message):
        config_of("llama", **changes)


@pytest.mark.parametrize("architecture, missing", [
    ("mixtral", "model.layers.1.block_sparse_moe.experts.2.w3.weight"),  # one expert's slice of a stacked weight
    ("qwen3", "model.layers.1.self_attn.k_norm.weight"),  # a per-head norm
])
def test_a_missing_weight_is_named_by_its_checkpoint_name(architecture, missing, tmp_path):
    source = make_test_model(tmp_path / "source", architecture, seed=3)
    weights = load_file(source / "model.safetensors")
    del weights[missing]
    broken = tmp_path / "broken"
    broken.mkdir()
    save_file(weights, str(broken / "model.safetensors"))
    (broken / "config.json").write_text((source / "config.json").read_text())
    with pytest.raises(ValueError, match=rf"missing 1 weight\(s\), e.g. \['{re.escape(missing)}'\]"):
        load_model(broken)


def test_an_unsupported_architecture_is_named_before_its_missing_fields():
    with pytest.raises(ValueError, match="unsupported model architecture 'GPT2LMHeadModel' \\(config.json model_type 'gpt2'\\)"):
        config_of("gpt2", hidden_size=...)


def test_rope_parameters_theta_wins_over_the_top_level_key_as_in_transformers():
    assert config_of("llama", rope_theta=1e6, rope_parameters={"rope_type": "default", "rope_theta": 100.0}).rope_theta == 100.0


def test_checkpoint_files_that_cannot_be_read_are_named(qwen_path, tmp_path):
    (tmp_path / "config.json").write_text((qwen_path / "config.json").read_text())
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="it has pytorch_model.bin, a pickle checkpoint"):
        load_model(tmp_path)
    (tmp_path / "model.safetensors").write_bytes((qwen_path / "model.safetensors").read_bytes()[:100])
    with pytest.raises(ValueError, match="cannot read checkpoint file '.*model.safetensors'"):
        load_model(tmp_path)


def test_a_tied_config_with_a_different_stored_head_is_refused(qwen_path, tmp_path):
    config = json.loads((qwen_path / "config.json").read_text())
    weights = load_file(str(qwen_path / "model.safetensors"))
    config["tie_word_embeddings"] = True
    (tmp_path / "config.json").write_text(json.dumps(config))
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"].clone()
    save_file(weights, str(tmp_path / "model.safetensors"))
    load_model(tmp_path)  # a copy of the embedding: tied, as before
    weights["lm_head.weight"] = weights["lm_head.weight"] + 1.0
    save_file(weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="lm_head.weight differs from model.embed_tokens.weight"):
        load_model(tmp_path)


def test_internlm3s_published_bias_switches_read_as_transformers_5_writes_them(tmp_path):
    """InternLM3's published config says qkv_bias and bias; transformers 5 writes attention_bias and mlp_bias. Both
    spellings load every bias of the same checkpoint."""
    import json

    from engine.models import make_test_model

    path = make_test_model(tmp_path / "internlm3", "internlm3", seed=3)
    written, _ = load_model(path, torch.float32, "cpu")
    config = json.loads((path / "config.json").read_text())
    config["qkv_bias"], config["bias"] = config.pop("attention_bias"), config.pop("mlp_bias")
    (path / "config.json").write_text(json.dumps(config))
    published, _ = load_model(path, torch.float32, "cpu")
    names = {name for name, _ in published.named_parameters()}
    assert {"model.layers.0.self_attn.o_proj.bias", "model.layers.0.mlp.down_proj.bias"} <= names
    for (name, parameter), (_, other) in zip(published.named_parameters(), written.named_parameters()):
        assert torch.equal(parameter, other), name
