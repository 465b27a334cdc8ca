"""Mixture-of-experts checkpoints (Mixtral, Qwen2-MoE): config parsing, loading and its errors, the expert
computation against a per-token reference, half precision, and the engine end to end. Logit and greedy-token
equality with transformers is in test_models_vs_transformers.py."""

import json
import random

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.models import load_model, make_test_model
from engine.models.config import ModelConfig
from engine.models.moe import SparseMoeBlock
from engine.models.moe_model import MixtralForCausalLM, Qwen2MoeForCausalLM


@pytest.fixture(scope="module")
def mixtral_path(tmp_path_factory):
    return make_test_model(tmp_path_factory.mktemp("mixtral"), "mixtral", seed=3)


@pytest.fixture(scope="module")
def qwen2_moe_path(tmp_path_factory):
    return make_test_model(tmp_path_factory.mktemp("qwen2_moe"), "qwen2_moe", num_experts=6, num_experts_per_token=2,
                           seed=4)


BASE = {"vocab_size": 10, "hidden_size": 64, "intermediate_size": 16, "num_hidden_layers": 4,
        "num_attention_heads": 16}


def test_configs_take_transformers_defaults_for_absent_keys():
    mixtral = ModelConfig.from_dict({**BASE, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral"})
    assert (mixtral.moe.num_experts, mixtral.moe.num_experts_per_token, mixtral.moe.expert_intermediate_size) == (8, 2, 16)
    assert mixtral.moe.normalize_top_k and mixtral.rope_theta == 1e6 and mixtral.num_key_value_heads == 8
    assert (mixtral.attention_bias, mixtral.mlp_bias, mixtral.sliding_window) == (False, False, None)
    qwen = ModelConfig.from_dict({**BASE, "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
                                  "sliding_window": 4096, "num_key_value_heads": 4})
    moe = qwen.moe
    assert (moe.num_experts, moe.num_experts_per_token, moe.expert_intermediate_size,
            moe.shared_expert_intermediate_size, moe.normalize_top_k) == (60, 4, 1408, 5632, False)
    assert qwen.attention_bias and qwen.sliding_window is None  # a stored window that no layer uses
    assert moe.dense_layers == ()
    # transformers' rule for dense layers: the listed ones, and all but every decoder_sparse_step-th.
    mixed = ModelConfig.from_dict({**BASE, "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
                                   "num_key_value_heads": 4, "decoder_sparse_step": 2, "mlp_only_layers": [3]})
    assert mixed.moe.dense_layers == (0, 2, 3)


@pytest.mark.parametrize("changes, message", [
    ({"num_experts_per_tok": 9}, "num_experts_per_tok=9 exceeds the 8 experts"),
    ({"num_local_experts": 0}, "num_local_experts must be a positive integer, got 0"),
])
def test_impossible_mixtral_configs_are_refused_by_key(changes, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_dict({**BASE, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", **changes})


def test_a_sliding_qwen2_moe_is_refused():
    with pytest.raises(ValueError, match="use_sliding_window=true"):
        ModelConfig.from_dict({**BASE, "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
                               "num_key_value_heads": 4, "use_sliding_window": True})


def _per_token_reference(block: SparseMoeBlock, x: torch.Tensor) -> torch.Tensor:
    """The MoE layer's definition, one token at a time: softmax, top-k, (renormalize), weighted expert sum."""
    out = []
    for row in x:
        probabilities = torch.softmax(block.gate(row).float(), dim=-1)
        weights, ids = torch.topk(probabilities, block.top_k)
        if block.normalize_top_k:
            weights = weights / weights.sum()
        total = torch.zeros_like(row)
        for weight, expert in zip(weights, ids.tolist()):
            gate, up = (block.experts.gate_up_proj[expert] @ row).split(block.intermediate_size)
            total += weight * (block.experts.down_proj[expert] @ (torch.nn.functional.silu(gate) * up))
        if block.shared_expert is not None:
            total += torch.sigmoid(block.shared_expert_gate(row)) * block.shared_expert(row[None])[0]
        out.append(total)
    return torch.stack(out)


@pytest.mark.parametrize("architecture", ["mixtral", "qwen2_moe"])
def test_grouped_experts_equal_the_per_token_definition(architecture, mixtral_path, qwen2_moe_path):
    model, config = load_model(mixtral_path if architecture == "mixtral" else qwen2_moe_path, torch.float32)
    block = model.model.layers[1].mlp
    # A router with real preferences (the test checkpoint's is near uniform), so routing is not arbitrary.
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        block.gate.weight.normal_(0.0, 1.0, generator=generator)
    x = torch.randn(37, config.hidden_size, generator=generator)
    expert_ids, _ = block.route(x)
    assert len(set(expert_ids.flatten().tolist())) > 1  # several experts run
    with torch.no_grad():
        torch.testing.assert_close(block(x), _per_token_reference(block, x), atol=1e-5, rtol=1e-5)
        # One token alone gets what it gets in a batch: rows do not interact.
        torch.testing.assert_close(block(x[5:6]), block(x)[5:6], atol=1e-6, rtol=1e-5)
        assert block(x[:0]).shape == (0, config.hidden_size)  # an empty batch


def test_a_checkpoint_with_more_experts_than_the_config_is_refused(qwen2_moe_path, tmp_path):
    config = json.loads((qwen2_moe_path / "config.json").read_text())
    config["num_experts"] = 4
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes((qwen2_moe_path / "model.safetensors").read_bytes())
    with pytest.raises(ValueError, match="checkpoint has expert 4 .* config.json declares 4 experts"):
        load_model(tmp_path)


def test_transformers_5_stacked_layout_loads_the_same_model(mixtral_path, tmp_path):
    """A checkpoint saved with the experts stacked (transformers 5's in-memory names) is the same model."""
    reference, _ = load_model(mixtral_path, torch.float32)
    weights = {name: tensor for name, tensor in load_file(mixtral_path / "model.safetensors").items()
               if ".block_sparse_moe.experts." not in name}
    weights.update({name: tensor.clone() for name, tensor in reference.state_dict().items() if ".mlp.experts." in name})
    save_file(weights, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((mixtral_path / "config.json").read_text())
    model, _ = load_model(tmp_path, torch.float32)
    for name, tensor in reference.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_tracks_float32(qwen2_moe_path, dtype):
    from tests.models.test_models_vs_transformers import PagedSession

    tokens = [random.Random(1).randrange(4, 500) for _ in range(20)]
    low_model, config = load_model(qwen2_moe_path, dtype)
    high_model, _ = load_model(qwen2_moe_path, torch.float32)
    assert isinstance(low_model, Qwen2MoeForCausalLM)
    low = PagedSession(low_model, config).step({"r": tokens})["r"].float()
    high = PagedSession(high_model, config).step({"r": tokens})["r"]
    assert torch.isfinite(low).all()
    torch.testing.assert_close(low, high, atol=2e-2, rtol=0)


def test_the_engine_generates_with_a_mixture_of_experts(mixtral_path):
    """Prefix caching, chunked prefill and batching do not change an MoE model's greedy tokens or their
    log-probabilities: each row's experts depend on that row alone."""
    from engine import LLM, SamplingParams

    prompts = [[random.Random(seed).randrange(4, 500) for _ in range(40)] for seed in range(3)]
    prompts.append(prompts[0][:32] + [7, 8, 9])  # shares two blocks with the first
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=1)

    def tokens_and_logprobs(completion):
        return completion.token_ids, [entry[token].logprob for token, entry in zip(completion.token_ids,
                                                                                    completion.logprobs)]
    single = LLM(model=str(mixtral_path), skip_tokenizer_init=True, enable_prefix_caching=False)
    assert isinstance(single.model_runner.model, MixtralForCausalLM)
    alone = [tokens_and_logprobs(single.generate([prompt], params, use_tqdm=False)[0].outputs[0]) for prompt in prompts]
    batched = LLM(model=str(mixtral_path), skip_tokenizer_init=True, max_num_batched_tokens=24)
    together = [tokens_and_logprobs(output.outputs[0]) for output in batched.generate(prompts, params, use_tqdm=False)]
    for (tokens, logprobs), (expected_tokens, expected_logprobs) in zip(together, alone):
        assert tokens == expected_tokens
        assert logprobs == pytest.approx(expected_logprobs, abs=1e-4)
