"""gpt-oss checkpoints: config parsing and its errors, the experts' clamped activation, attention sinks in each of
the torch backend's paths, the torch-only backend rule, and the engine end to end on vLLM's hybrid KV cache.
Logit equality with transformers is in test_models_vs_transformers.py."""

import json
import random

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.models import load_model, make_test_model
from engine.models.config import ModelConfig
from engine.models.gpt_oss import GptOssForCausalLM
from engine.models.mxfp4 import dequantize_mxfp4
from engine.runner.attention.torch_backend import scaled_dot_product
from tests.models.engine_generation import (assert_cuda_generates_the_cpu_tokens,
                                           assert_engine_generates_as_transformers, prompts)

BASE = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "vocab_size": 100, "hidden_size": 64,
        "intermediate_size": 32, "num_hidden_layers": 4, "num_attention_heads": 16}


@pytest.fixture(scope="module")
def gpt_oss_path(tmp_path_factory):
    # Expert widths that are whole MXFP4 blocks of 32, as gpt-oss's 2880 are.
    return make_test_model(tmp_path_factory.mktemp("gpt_oss"), "gpt_oss", num_hidden_layers=4, intermediate_size=64,
                           seed=6)


def test_configs_take_transformers_defaults():
    config = ModelConfig.from_dict(BASE)
    assert config.layer_sliding_windows == (128, None, 128, None)  # even layers windowed
    assert config.rope_scaling["rope_type"] == "yarn" and config.rope_scaling["truncate"] is False
    assert (config.rope_theta, config.num_key_value_heads, config.head_dim, config.attention_bias) == (150000.0, 8, 64, True)
    moe = config.moe
    assert (moe.num_experts, moe.num_experts_per_token, moe.expert_intermediate_size, moe.normalize_top_k) == (128, 4, 32, True)
    listed = ModelConfig.from_dict({**BASE, "sliding_window": 16,
                                    "layer_types": ["full_attention", "sliding_attention"] * 2})
    assert listed.layer_sliding_windows == (None, 16, None, 16)


@pytest.mark.parametrize("changes, message", [
    ({"layer_types": ["full_attention"]}, "layer_types must list 'full_attention' or 'sliding_attention' for each of "
                                          "the 4 layers"),
    ({"sliding_window": None}, "layer_types has sliding_attention layers but sliding_window is null"),
    ({"swiglu_limit": 0}, "swiglu_limit must be a positive number, got 0"),
    ({"num_experts_per_tok": 200}, "num_experts_per_tok=200 exceeds the 128 experts"),
    ({"quantization_config": {"quant_method": "fp8"}}, "quant_method 'fp8'"),
])
def test_impossible_gpt_oss_configs_are_refused_by_key(changes, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_dict({**BASE, **changes})


def test_the_experts_clamp_their_gate_and_up(gpt_oss_path):
    model, _ = load_model(gpt_oss_path, torch.float32)
    experts = model.model.layers[0].mlp.experts
    # Columns alternate gate, up: gate 10 is capped at 7, up -9 at -7; gate -2 and up 3 pass as they are.
    gate_up = torch.tensor([[10.0, -9.0, -2.0, 3.0]])
    gates, ups = torch.tensor([7.0, -2.0]), torch.tensor([-7.0, 3.0])
    expected = (ups + 1) * gates * torch.sigmoid(1.702 * gates)
    torch.testing.assert_close(experts.activation(gate_up), expected[None])


def test_a_sink_takes_its_share_of_each_heads_attention():
    """The written-out softmax with a sink column: a sink of log(n) beside n equal scores halves each weight."""
    generator = torch.Generator().manual_seed(0)
    query = torch.zeros(2, 1, 8)  # two heads, one query: every score 0
    key, value = torch.randn(2, 4, 8, generator=generator), torch.randn(2, 4, 8, generator=generator)
    sinks = torch.tensor([float("-inf"), torch.log(torch.tensor(4.0)).item()]).view(2, 1, 1)
    out = scaled_dot_product(query, key, value, scale=1.0, sinks=sinks)
    torch.testing.assert_close(out[0], value[0].mean(0, keepdim=True))  # no sink: plain attention
    torch.testing.assert_close(out[1], value[1].mean(0, keepdim=True) / 2)


def test_flash_attn_is_refused_for_sinks(gpt_oss_path, monkeypatch):
    import engine.runner.config as runner_config
    from engine.runner.config import resolve_attention_backend

    unsupported = GptOssForCausalLM.unsupported_attention_backends
    with pytest.raises(ValueError, match="attention_backend 'flash_attn' cannot run attention sinks .*; use "
                                         "attention_backend 'triton' or 'torch'"):
        resolve_attention_backend("flash_attn", torch.device("cuda"), unsupported)
    # On CUDA with flash-attn installed, the default skips it.
    monkeypatch.setattr(runner_config, "flash_attn_importable", lambda: True)
    assert resolve_attention_backend(None, torch.device("cuda"), unsupported) in ("triton", "torch")
    model, _ = load_model(gpt_oss_path, torch.float32)
    with pytest.raises(ValueError, match="attention_backend 'flash_attn' cannot run attention sinks"):
        model.set_attention_backend("flash_attn")


def test_the_engine_generates_what_transformers_generates(gpt_oss_path):
    """Through the scheduler on the hybrid KV cache (windowed layers' blocks handed back): chunked prefill, prefix
    caching and preemption leave greedy tokens as transformers' generate gives them, and no block leaks."""
    token_prompts = prompts(length=40)
    token_prompts.append(token_prompts[0][:32] + [7, 8, 9])  # shares two blocks with the first
    llm = assert_engine_generates_as_transformers(gpt_oss_path, token_prompts, max_num_batched_tokens=24,
                                                  num_gpu_blocks=14, max_model_len=64)
    assert isinstance(llm.model_runner.model, GptOssForCausalLM)
    assert llm.model_runner.kv_cache_grouping is not None  # windowed and full layers: the hybrid cache
    assert llm.scheduler.num_preemptions_total > 0
    manager = llm.scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks


def test_mxfp4_dequantizes_as_transformers_does():
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    generator = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 10, 4, 16), dtype=torch.uint8, generator=generator)
    scales = torch.randint(100, 150, (3, 10, 4), dtype=torch.uint8, generator=generator)
    for dtype in (torch.float32, torch.bfloat16):
        ours = dequantize_mxfp4(blocks, scales, dtype).transpose(1, 2)
        assert torch.equal(ours, convert_moe_packed_tensors(blocks, scales, dtype=dtype))
    # Code 0x21: low nibble 1 (0.5) first, then 2 (1.0); scale 128 doubles them.
    assert dequantize_mxfp4(torch.tensor([[0x21] * 16], dtype=torch.uint8), torch.tensor([128], dtype=torch.uint8),
                            torch.float32)[:2].tolist() == [1.0, 2.0]
    with pytest.raises(ValueError, match="need scales of shape"):
        dequantize_mxfp4(blocks, scales[..., :2], torch.float32)


def test_an_mxfp4_checkpoint_is_its_dequantized_model(gpt_oss_path, tmp_path):
    """OpenAI's layout: experts as MXFP4 blocks and scales under quantization_config; the engine's model equals one
    loaded from the same weights dequantized by transformers' converter and stored in float32."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from tests.models.test_models_vs_transformers import PagedSession

    config = json.loads((gpt_oss_path / "config.json").read_text())
    weights = load_file(gpt_oss_path / "model.safetensors")
    generator = torch.Generator().manual_seed(1)
    quantized, dequantized = dict(weights), dict(weights)
    for name in [name for name in weights if name.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        experts, inputs, outputs = weights[name].shape
        blocks = torch.randint(0, 256, (experts, outputs, inputs // 32, 16), dtype=torch.uint8, generator=generator)
        scales = torch.randint(118, 124, (experts, outputs, inputs // 32), dtype=torch.uint8, generator=generator)
        del quantized[name]
        quantized[f"{name}_blocks"], quantized[f"{name}_scales"] = blocks, scales
        dequantized[name] = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    for folder, tensors, extra in ((tmp_path / "mxfp4", quantized, {"quantization_config": {"quant_method": "mxfp4"}}),
                                   (tmp_path / "float32", dequantized, {})):
        folder.mkdir()
        save_file(tensors, str(folder / "model.safetensors"))
        (folder / "config.json").write_text(json.dumps({**config, **extra}))
    mxfp4_model, model_config = load_model(tmp_path / "mxfp4", torch.float32)
    reference, _ = load_model(tmp_path / "float32", torch.float32)
    for name, tensor in reference.state_dict().items():
        assert torch.equal(mxfp4_model.state_dict()[name], tensor), name
    tokens = [random.Random(3).randrange(4, 500) for _ in range(20)]
    torch.testing.assert_close(PagedSession(mxfp4_model, model_config).step({"r": tokens})["r"],
                               PagedSession(reference, model_config).step({"r": tokens})["r"], atol=0, rtol=0)
    # A blocks tensor without its scales is named.
    del quantized["model.layers.0.mlp.experts.down_proj_scales"]
    save_file(quantized, str(tmp_path / "mxfp4" / "model.safetensors"))
    with pytest.raises(ValueError, match="has model.layers.0.mlp.experts.down_proj_blocks but not "
                                         "model.layers.0.mlp.experts.down_proj_scales"):
        load_model(tmp_path / "mxfp4", torch.float32)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_engine_generates_the_cpu_tokens(gpt_oss_path):
    """On a GPU a backend with sinks is chosen and the tokens are the CPU's."""
    assert assert_cuda_generates_the_cpu_tokens(gpt_oss_path).model_runner.attention_backend in ("triton", "torch")