"""Qwen3 and Qwen3-MoE checkpoints: config defaults and refusals, the per-head q/k norms, loading errors, and
the engine end to end. Logit and greedy-token equality with transformers is in test_models_vs_transformers.py."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.models import load_model, make_test_model
from engine.models.config import ModelConfig
from engine.models.moe_model import Qwen3MoeForCausalLM
from engine.models.qwen3 import Qwen3ForCausalLM

BASE = {"vocab_size": 10, "hidden_size": 64, "intermediate_size": 16, "num_hidden_layers": 4,
        "num_attention_heads": 16}
QWEN3 = {**BASE, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_attention_heads": 32}


@pytest.fixture(scope="module")
def qwen3_path(tmp_path_factory):
    return make_test_model(tmp_path_factory.mktemp("qwen3"), "qwen3", head_dim=32, seed=5)


def test_configs_take_transformers_defaults_for_absent_keys():
    qwen3 = ModelConfig.from_dict(QWEN3)
    # head_dim is its own key (128), not hidden_size / num_attention_heads (2); no bias anywhere.
    assert (qwen3.head_dim, qwen3.num_key_value_heads, qwen3.attention_bias, qwen3.mlp_bias) == (128, 32, False, False)
    assert qwen3.sliding_window is None and qwen3.moe is None
    moe = ModelConfig.from_dict({**BASE, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                                 "num_experts": 16})
    assert (moe.head_dim, moe.num_key_value_heads) == (4, 4)  # transformers: hidden_size / heads when absent
    experts = moe.moe
    assert (experts.num_experts_per_token, experts.expert_intermediate_size, experts.normalize_top_k,
            experts.shared_expert_intermediate_size, experts.routing_weights_in_float32) == (8, 768, False, 0, False)
    # A Qwen2-style mlp_bias key is ignored, as transformers' Qwen MLPs have no bias.
    assert not ModelConfig.from_dict({**QWEN3, "mlp_bias": True}).mlp_bias


def test_sliding_window_layers_and_an_unused_window():
    unused = ModelConfig.from_dict({**QWEN3, "use_sliding_window": True, "max_window_layers": 4, "sliding_window": 64})
    assert unused.sliding_window is None  # layers 0-3 all below max_window_layers: full attention everywhere
    sliding = ModelConfig.from_dict({**QWEN3, "use_sliding_window": True, "max_window_layers": 2, "sliding_window": 64})
    assert sliding.layer_sliding_windows == (None, None, 64, 64)
    assert [layer.self_attn.sliding_window for layer in Qwen3ForCausalLM(sliding).model.layers] == [None, None, 64, 64]
    with pytest.raises(ValueError, match="Qwen3-MoE with use_sliding_window=true"):
        ModelConfig.from_dict({**BASE, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                               "use_sliding_window": True})


def test_q_and_k_are_normalized_per_head_before_rope(qwen3_path):
    model, config = load_model(qwen3_path, torch.float32)
    attention = model.model.layers[0].self_attn
    assert attention.q_norm.weight.shape == (32,) and attention.q_size == 4 * 32 != config.hidden_size
    # The norms were loaded as drawn, not left at one, and differ: a swap of q_norm and k_norm would show.
    assert not torch.equal(attention.q_norm.weight, attention.k_norm.weight)
    assert not torch.equal(attention.q_norm.weight, torch.ones(32))
    x = torch.randn(3, 2, 32)
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + config.rms_norm_eps) * attention.q_norm.weight
    torch.testing.assert_close(attention.q_norm(x), expected)


def test_a_qwen3_moe_has_no_shared_expert_and_keeps_its_dense_layers(tmp_path):
    path = make_test_model(tmp_path / "moe", "qwen3_moe", num_experts=4, num_experts_per_token=2, seed=2)
    config = json.loads((path / "config.json").read_text())
    config.update(decoder_sparse_step=2)  # layer 0 dense (intermediate_size wide), layer 1 sparse
    weights = load_file(path / "model.safetensors")
    for name in [name for name in weights if name.startswith("model.layers.0.mlp.")]:
        del weights[name]
    hidden, width = config["hidden_size"], config["intermediate_size"]
    generator = torch.Generator().manual_seed(1)
    for name, shape in (("gate_proj", (width, hidden)), ("up_proj", (width, hidden)), ("down_proj", (hidden, width))):
        weights[f"model.layers.0.mlp.{name}.weight"] = torch.randn(shape, generator=generator) * 0.02
    dense = tmp_path / "dense"
    dense.mkdir()
    (dense / "config.json").write_text(json.dumps(config))
    save_file(weights, str(dense / "model.safetensors"))
    model, loaded = load_model(dense, torch.float32)
    assert isinstance(model, Qwen3MoeForCausalLM) and loaded.moe.dense_layers == (0,)
    assert model.model.layers[1].mlp.shared_expert is None
    assert not hasattr(model.model.layers[0].mlp, "experts")


def test_a_qwen3_moe_saved_by_transformers_matches_it(tmp_path):
    """transformers 5 saves num_experts as num_local_experts; this checkpoint also keeps dense layers (listed, and
    off the sparse step) and ties its embeddings, each of which changes which weights the model reads."""
    from transformers import Qwen3MoeConfig
    from transformers import Qwen3MoeForCausalLM as TransformersQwen3Moe

    from tests.models.test_models_vs_transformers import ATOL, PagedSession, hf_logits

    torch.manual_seed(0)
    hf_config = Qwen3MoeConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=24, moe_intermediate_size=32,
                               num_experts=6, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=2,
                               mlp_only_layers=[1], tie_word_embeddings=True)
    hf_model = TransformersQwen3Moe(hf_config).eval()
    hf_model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert "num_experts" not in saved and saved["num_local_experts"] == 6
    model, config = load_model(tmp_path, torch.float32)
    assert config.moe.num_experts == 6 and config.moe.dense_layers == (0, 1, 2) and config.tie_word_embeddings
    tokens = [(7 * i) % 290 + 5 for i in range(30)]
    logits = PagedSession(model, config).step({"r": tokens})["r"]
    torch.testing.assert_close(logits, hf_logits(hf_model, tokens), atol=ATOL, rtol=0)
    # With both keys, transformers reads num_local_experts.
    both = ModelConfig.from_dict({**saved, "num_experts": 128})
    assert both.moe.num_experts == 6


def test_the_engine_generates_with_qwen3(qwen3_path):
    """Prefix caching, chunked prefill and batching do not change Qwen3's greedy tokens."""
    from engine import LLM, SamplingParams

    prompts = [[5, 9, 13, 200, 7] * 8, [11, 12, 13], [5, 9, 13, 200, 7] * 7 + [40, 41]]  # the third shares blocks
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    single = LLM(model=str(qwen3_path), skip_tokenizer_init=True, enable_prefix_caching=False)
    assert isinstance(single.model_runner.model, Qwen3ForCausalLM)
    alone = [single.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids for prompt in prompts]
    batched = LLM(model=str(qwen3_path), skip_tokenizer_init=True, max_num_batched_tokens=24)
    together = [output.outputs[0].token_ids for output in batched.generate(prompts, params, use_tqdm=False)]
    assert together == alone and all(len(tokens) == 8 for tokens in alone)
