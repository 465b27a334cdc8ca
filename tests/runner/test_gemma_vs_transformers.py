"""Gemma 2 and Gemma 3's text model against transformers' Gemma2ForCausalLM / Gemma3ForCausalLM on the same random
weights (fp32): every logits row within 1e-4 and greedy tokens equal, through the real scheduler (chunked prefill,
prefix caching, preemption), far past the local layers' window. The checkpoint is saved by transformers itself,
with every norm weight drawn away from 0 (Gemma's norms multiply by 1 + weight), q and k norms apart, so a mix-up
of any of them shows; Gemma 2's attention cap is set low enough (5) that scores reach it."""

import pytest
import torch

from tests.engine.model_fixtures import hf_greedy, mixed_prompts
from tests.runner.test_model_runner_vs_transformers import RecordingExecutor, make_engine, run_and_check

transformers = pytest.importorskip("transformers")

WINDOW = 10


def save_tiny_gemma2(path, **config):
    settings = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=32, sliding_window=WINDOW, query_pre_attn_scalar=24,
                    max_position_embeddings=1024, attn_logit_softcapping=5.0, final_logit_softcapping=3.0,
                    bos_token_id=1, eos_token_id=2, pad_token_id=0)
    settings.update(config)
    return save_tiny(path, transformers.Gemma2Config(**settings), transformers.Gemma2ForCausalLM)


def save_tiny(path, hf_config, model_class):
    torch.manual_seed(0)
    model = model_class(hf_config).to(torch.float32).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.copy_(torch.randn_like(parameter) * 0.5)
            elif "q_proj" in name or "k_proj" in name:
                parameter.mul_(4.0)  # larger scores, so that an attention cap bites
    model.save_pretrained(path)
    return model_class.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()


def save_tiny_gemma3(path, **config):
    settings = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=32, sliding_window=WINDOW, sliding_window_pattern=2,
                    query_pre_attn_scalar=24, max_position_embeddings=1024, rope_local_base_freq=5000.0,
                    rope_scaling={"rope_type": "linear", "factor": 4.0}, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    settings.update(config)
    return save_tiny(path, transformers.Gemma3TextConfig(**settings), transformers.Gemma3ForCausalLM)


@pytest.fixture(scope="module", params=["gemma3", "gemma3-softcapped", "gemma2"])
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    if request.param == "gemma2":
        return path, save_tiny_gemma2(path)
    hf_model = save_tiny_gemma3(path, final_logit_softcapping=3.0 if request.param == "gemma3-softcapped" else None)
    return path, hf_model


@pytest.mark.parametrize("hybrid", [False, True], ids=["one-table", "hybrid"])
@pytest.mark.parametrize("num_gpu_blocks,budget", [(200, 48), (12, 32)], ids=["roomy", "preempting"])
def test_every_logits_row_matches_transformers(checkpoint, num_gpu_blocks, budget, hybrid):
    path, hf_model = checkpoint
    core, runner = make_engine(path, num_gpu_blocks, max_num_batched_tokens=budget, hybrid=hybrid)
    windows = [layer.self_attn.sliding_window for layer in runner.model.model.layers]
    assert windows == [WINDOW, None, WINDOW, None]  # every second layer is global (Gemma 2; Gemma 3's pattern 2 here)
    # Some layers read everything: in one table no block leaves; in the hybrid cache the local group's do.
    assert not core.scheduler.cache_config.frees_out_of_window_blocks
    assert core.scheduler.cache_config.kv_cache_groups == ((None, WINDOW) if hybrid else None)
    core.executor = RecordingExecutor(core.executor)
    prompts = mixed_prompts(runner.vocab_size, seed=3, num_prompts=8)
    tokens = run_and_check(core, runner, hf_model, prompts, max_tokens=16)
    if num_gpu_blocks == 12:
        assert core.scheduler.num_preemptions_total > 0
    # Greedy decoding of the first prompts equals transformers' own generate.
    for index in range(2):
        assert tokens[f"r{index}"][len(prompts[index]):] == hf_greedy(hf_model, prompts[index], 16)


def test_gemma2_caps_attention_scores_by_default_and_refuses_a_bad_cap(tmp_path):
    from engine.models import ModelConfig, load_model

    save_tiny_gemma2(tmp_path / "defaults", attn_logit_softcapping=50.0)
    model, _ = load_model(tmp_path / "defaults")
    assert {layer.self_attn.logits_soft_cap for layer in model.model.layers} == {50.0}
    base = {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "vocab_size": 10, "hidden_size": 64,
            "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4}
    assert ModelConfig.from_dict(base).layer_sliding_windows == (4096, None)  # transformers' defaults
    with pytest.raises(ValueError, match="attn_logit_softcapping must be a positive number or null, got 0"):
        ModelConfig.from_dict({**base, "attn_logit_softcapping": 0})


def test_a_lora_adapter_on_gemma3_equals_transformers_with_it_merged(tmp_path):
    """The adapted projections of every Gemma layer (q, k, v, o, gate, up, down) through the LoRA runner: greedy
    tokens equal transformers' on weights with the adapter merged in."""
    import json

    from safetensors.torch import load_file

    from engine import LLM, SamplingParams
    from engine.core import LoRARequest
    from engine.models.make_lora import main as make_lora

    hf_model = save_tiny_gemma3(tmp_path / "gemma")
    assert make_lora([str(tmp_path / "adapter"), "--model", str(tmp_path / "gemma"), "--rank", "4"]) == 0
    llm = LLM(model=str(tmp_path / "gemma"), skip_tokenizer_init=True, num_gpu_blocks=64, max_model_len=512,
              enable_lora=True, max_lora_rank=8)
    prompt = list(range(5, 40))
    output = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
                          lora_request=LoRARequest("adapter", 1, str(tmp_path / "adapter")))
    adapter = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    weights = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    parameters = dict(hf_model.named_parameters())
    with torch.no_grad():
        for name, lora_a in weights.items():
            if "lora_A" in name:
                target = name.removeprefix("base_model.model.").replace(".lora_A.weight", ".weight")
                parameters[target] += adapter["lora_alpha"] / adapter["r"] * weights[name.replace("lora_A", "lora_B")] @ lora_a
    assert output[0].outputs[0].token_ids == hf_greedy(hf_model, prompt, 12)
