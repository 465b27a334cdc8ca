"""DeepSeek-V2/V3 checkpoints (multi-head latent attention, DeepSeek's routers): config parsing and its errors, the
router's rules, the latent KV cache's size and layout, loading (the MTP layer skipped, the router in float32),
backends, and the engine end to end. Logit and greedy-token equality with transformers is in
test_models_vs_transformers.py."""

import json
import random

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.models import load_model, make_test_model
from engine.models.config import ModelConfig
from engine.models.deepseek import DeepseekV3ForCausalLM
from engine.runner.attention import allocate_kv_caches, kv_cache_bytes_per_block
from tests.models.engine_generation import (assert_cuda_generates_the_cpu_tokens,
                                           assert_engine_generates_as_transformers, prompts)

BASE = {"vocab_size": 100, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
        "num_attention_heads": 4}


def _config(model_type="deepseek_v3", **changes):
    architecture = {"deepseek_v2": "DeepseekV2ForCausalLM"}.get(model_type, "DeepseekV3ForCausalLM")
    return ModelConfig.from_dict({**BASE, "architectures": [architecture], "model_type": model_type, **changes})


@pytest.fixture(scope="module")
def v3_path(tmp_path_factory):
    return make_test_model(tmp_path_factory.mktemp("deepseek_v3"), "deepseek_v3", num_hidden_layers=3, seed=5)


def test_configs_take_transformers_defaults_and_describe_the_latent_cache():
    v3 = _config()
    assert (v3.mla.kv_lora_rank, v3.mla.qk_rope_head_dim, v3.mla.q_lora_rank, v3.mla.v_head_dim) == (512, 64, 1536, 128)
    # The cache's view: one head of latent + RoPE key, no separate values.
    assert (v3.num_key_value_heads, v3.head_dim, v3.value_head_dim) == (1, 576, 0)
    assert v3.mla.softmax_scale == pytest.approx(192 ** -0.5)
    routing = v3.moe.deepseek_routing
    assert (routing.scoring, routing.num_groups, routing.top_k_groups, routing.group_score) == ("sigmoid", 8, 4, "top2_sum")
    assert routing.score_correction_bias and routing.routed_scaling_factor == 2.5
    assert (v3.moe.num_experts, v3.moe.num_experts_per_token, v3.moe.shared_expert_intermediate_size) == (256, 8, 2048)
    assert v3.moe.dense_layers == (0, 1, 2) and v3.moe.normalize_top_k
    assert _config(num_hidden_layers=2).moe.dense_layers == (0, 1)  # first_k_dense_replace capped by the layers

    v2 = _config("deepseek_v2", num_experts_per_tok=6, n_group=8, topk_group=3, topk_method="group_limited_greedy",
                 norm_topk_prob=True)
    routing = v2.moe.deepseek_routing
    assert (routing.scoring, routing.group_score, routing.score_correction_bias) == ("softmax", "max", False)
    assert v2.moe.dense_layers == () and v2.moe.shared_expert_intermediate_size == 2 * 1407
    assert not v2.moe.normalize_top_k  # transformers' DeepSeek-V2 never renormalizes
    assert _config("deepseek_v2", num_experts_per_tok=6).moe.deepseek_routing.num_groups == 1  # greedy
    # Kimi K2 is a DeepSeek-V3 under its own model_type.
    assert _config("kimi_k2", n_routed_experts=384, n_group=1, topk_group=1).moe.num_experts == 384


def test_yarn_scales_the_softmax_by_deepseeks_correction():
    scaling = {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "mscale": 1.0,
               "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1}
    config = _config(rope_scaling=scaling, max_position_embeddings=163840)
    mscale = 0.1 * 1.0 * torch.log(torch.tensor(40.0)).item() + 1.0
    assert config.mla.softmax_scale == pytest.approx(192 ** -0.5 * mscale ** 2)
    assert config.rope_scaling["rope_type"] == "yarn"


@pytest.mark.parametrize("changes, message", [
    ({"num_key_value_heads": 2}, "num_key_value_heads=2 differs from num_attention_heads=4"),
    ({"n_group": 3}, "n_group=3 does not divide the 256 routed experts"),
    ({"topk_group": 9}, "topk_group=9 exceeds n_group=8"),
    ({"n_routed_experts": 8, "n_group": 8, "topk_group": 2, "num_experts_per_tok": 1}, "fewer than 2 experts a group"),
    ({"n_routed_experts": 16, "n_group": 8, "topk_group": 1, "num_experts_per_tok": 3},
     "num_experts_per_tok=3 exceeds the experts of the topk_group=1 groups kept"),
    ({"moe_layer_freq": 2}, "moe_layer_freq=2 is not supported"),
    ({"qk_rope_head_dim": 63}, "qk_rope_head_dim must be even"),
    ({"kv_lora_rank": 0}, "kv_lora_rank must be a positive integer, got 0"),
    ({"num_experts_per_tok": 300}, "num_experts_per_tok=300 exceeds the 256 experts"),
])
def test_impossible_deepseek_configs_are_refused_by_key(changes, message):
    with pytest.raises(ValueError, match=message):
        _config(**changes)


def test_a_v2_config_with_v3_routing_is_refused():
    with pytest.raises(ValueError, match="topk_method 'noaux_tc' is DeepSeek-V3's"):
        _config("deepseek_v2", num_experts_per_tok=6, topk_method="noaux_tc")


def test_the_router_keeps_the_best_groups_and_lets_the_bias_steer_only_the_choice(v3_path):
    model, config = load_model(v3_path, torch.float32)
    router = model.model.layers[1].mlp.gate
    routing, experts_per_group = router.routing, config.moe.num_experts // router.routing.num_groups
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        router.weight.normal_(0.0, 1.0, generator=generator)
        router.e_score_correction_bias.zero_()
    x = torch.randn(50, config.hidden_size, generator=generator)
    with torch.no_grad():
        expert_ids, weights = router(x)
        scores = torch.sigmoid(x @ router.weight.T)
    groups = scores.view(50, routing.num_groups, experts_per_group).topk(2, dim=-1).values.sum(-1)
    kept = groups.topk(routing.top_k_groups, dim=-1).indices
    for row in range(50):
        assert set((expert_ids[row] // experts_per_group).tolist()) <= set(kept[row].tolist())
    # Weights: the chosen experts' scores, renormalized, times the scaling factor.
    chosen = scores.gather(1, expert_ids)
    torch.testing.assert_close(weights, chosen / chosen.sum(-1, keepdim=True) * routing.routed_scaling_factor)
    # A large bias on one expert makes every token choose it, but its weight stays its score.
    with torch.no_grad():
        router.e_score_correction_bias[3] = 100.0
        biased_ids, biased_weights = router(x)
    assert (biased_ids == 3).any(dim=-1).all()
    chosen = scores.gather(1, biased_ids)
    torch.testing.assert_close(biased_weights, chosen / chosen.sum(-1, keepdim=True) * routing.routed_scaling_factor)


def test_the_latent_cache_is_one_tensor_per_layer_and_costs_half_a_kv_pair():
    config = _config()
    caches = allocate_kv_caches(2, 4, 16, config.num_key_value_heads, config.head_dim, torch.float32, "cpu",
                                value_head_size=config.value_head_dim)
    assert all(key is value and key.shape == (4, 16, 1, 576) for key, value in caches)
    latent = kv_cache_bytes_per_block(61, 16, 1, 576, torch.bfloat16, value_head_size=0)
    assert latent == 61 * 16 * 576 * 2  # 70,272 bytes of DeepSeek-V3 KV per token, all layers
    assert kv_cache_bytes_per_block(61, 16, 1, 576, torch.bfloat16) == 2 * latent
    with pytest.raises(ValueError, match="value heads of 8 features beside keys of 576"):
        allocate_kv_caches(1, 2, 16, 1, 576, torch.float32, "cpu", value_head_size=8)


def test_the_mtp_layer_is_skipped_and_the_router_stays_float32(v3_path, tmp_path, caplog):
    weights = load_file(v3_path / "model.safetensors")
    config = json.loads((v3_path / "config.json").read_text())
    # DeepSeek-V3's checkpoints store their multi-token-prediction layer after the decoder's layers.
    extra = {f"model.layers.{config['num_hidden_layers']}.{name}": tensor.clone()
             for name, tensor in weights.items() if name.startswith("model.layers.1.")}
    extra[f"model.layers.{config['num_hidden_layers']}.eh_proj.weight"] = torch.zeros(4, 8)
    save_file({**weights, **extra}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(config))
    with caplog.at_level("WARNING"):
        model, _ = load_model(tmp_path, torch.bfloat16)
    assert not model.unexpected_weights and "does not use" not in caplog.text
    router = model.model.layers[1].mlp.gate
    assert router.weight.dtype == router.e_score_correction_bias.dtype == torch.float32
    assert model.model.layers[1].self_attn.kv_b_proj.weight.dtype == torch.bfloat16
    name = "model.layers.1.mlp.gate.e_score_correction_bias"
    assert torch.equal(router.e_score_correction_bias, weights[name].float())


def test_half_precision_tracks_float32(v3_path):
    from tests.models.test_models_vs_transformers import PagedSession

    tokens = [random.Random(2).randrange(4, 500) for _ in range(30)]
    low_model, config = load_model(v3_path, torch.bfloat16)
    high_model, _ = load_model(v3_path, torch.float32)
    low = PagedSession(low_model, config).step({"r": tokens})["r"].float()
    high = PagedSession(high_model, config).step({"r": tokens})["r"]
    assert torch.isfinite(low).all()
    torch.testing.assert_close(low, high, atol=3e-2, rtol=0)


def test_only_the_torch_backend_attends_latents(v3_path):
    from engine.runner.config import resolve_attention_backend

    unsupported = DeepseekV3ForCausalLM.unsupported_attention_backends
    with pytest.raises(ValueError, match="attention_backend 'triton' cannot run multi-head latent attention .*; use "
                                         "attention_backend 'torch'$"):
        resolve_attention_backend("triton", torch.device("cpu"), unsupported)
    assert resolve_attention_backend(None, torch.device("cuda"), unsupported) == "torch"
    model, _ = load_model(v3_path, torch.float32)
    with pytest.raises(ValueError, match="attention_backend 'flash_attn' cannot run"):
        model.set_attention_backend("flash_attn")


def test_the_engine_generates_what_transformers_generates(v3_path):
    """Through the scheduler: chunked prefill, prefix caching and preemption (few blocks) leave greedy tokens as
    transformers' generate gives them, and the KV pool is counted in latent blocks."""
    token_prompts = prompts(length=40)
    token_prompts.append(token_prompts[0][:32] + [7, 8, 9])  # shares two blocks with the first
    llm = assert_engine_generates_as_transformers(v3_path, token_prompts, max_num_batched_tokens=24, num_gpu_blocks=9,
                                                  max_model_len=64)
    assert isinstance(llm.model_runner.model, DeepseekV3ForCausalLM)
    assert llm.scheduler.num_preemptions_total > 0
    manager = llm.scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks  # none leaked
    key, value = llm.model_runner.kv_caches[0]
    assert key is value and key.shape[2:] == (1, 32 + 8)


def test_latents_offloaded_to_the_host_come_back_as_they_were(v3_path):
    """KV offloading copies the one latent tensor of each layer (its key and value are the same tensor)."""
    from engine import LLM
    from tests.engine.test_kv_offloading_real import PREFIX, count_loads, generate

    prompts = [PREFIX + [11, 12, 13], PREFIX + [21, 22, 23, 24, 25], PREFIX[:32] + [31, 32]]
    options = dict(model=str(v3_path), skip_tokenizer_init=True, num_gpu_blocks=9, max_num_seqs=1, max_model_len=128)
    plain = LLM(**options)
    expected = [generate(plain, prompt) for prompt in prompts]
    llm = LLM(**options, kv_offloading_size_gib=0.01)
    host_key, host_value = llm.model_runner.host_kv_cache.caches[0]
    assert host_key is host_value
    loaded = count_loads(llm)
    got = []
    for prompt in prompts:
        assert llm.engine_core.scheduler.reset_prefix_cache()
        got.append(generate(llm, prompt))
    assert sum(loaded) == 3 + 2
    for (tokens, logprobs), (expected_tokens, expected_logprobs) in zip(got, expected):
        assert tokens == expected_tokens
        assert logprobs == pytest.approx(expected_logprobs, abs=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_engine_generates_the_cpu_tokens(v3_path):
    """On a GPU the torch backend is chosen (the only one that runs this model) and the tokens are the CPU's."""
    assert assert_cuda_generates_the_cpu_tokens(v3_path).model_runner.attention_backend == "torch"


def test_glm_4_5_runs_deepseeks_experts_behind_grouped_query_attention(tmp_path):
    """GLM-4.5 (Glm4MoeForCausalLM): V3's router and experts, Llama's attention with RoPE on half of each head;
    any backend may run it, and the engine's greedy tokens are transformers'."""
    from engine.models.glm4_moe import Glm4MoeForCausalLM

    path = make_test_model(tmp_path / "glm", "glm4_moe", num_hidden_layers=3, seed=8)
    config = ModelConfig.from_pretrained(path)
    assert config.mla is None and config.rotary_dim == config.head_dim // 2 and config.moe.dense_layers == (0,)
    assert config.moe.deepseek_routing.score_correction_bias and Glm4MoeForCausalLM.unsupported_attention_backends == {}
    assert_engine_generates_as_transformers(path, prompts(), max_num_batched_tokens=16, num_gpu_blocks=12,
                                            max_model_len=64)