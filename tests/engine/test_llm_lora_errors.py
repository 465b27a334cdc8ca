"""Every way a LoRA adapter or a lora_request can be wrong is a ValueError naming the file, field or key and
the value, raised before anything is added: the engine keeps no request and no block, and serves on."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import LLM, SamplingParams
from engine.core import LoRARequest
from engine.models import make_test_model
from engine.models.make_lora import make_lora_adapter

PARAMS = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_llama_path):
    return LLM(model=str(tiny_llama_path), enable_lora=True, max_loras=2, max_lora_rank=8, num_gpu_blocks=64,
               max_num_seqs=8)


@pytest.fixture
def adapter(tiny_llama_path, tmp_path):
    return make_lora_adapter(tmp_path / "adapter", tiny_llama_path, rank=4, alpha=8, seed=0)


def edit_config(folder, **changes):
    path = folder / "adapter_config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def edit_weights(folder, change):
    path = folder / "adapter_model.safetensors"
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path))


LORA_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"


def add_key(key, shape):
    return lambda tensors: tensors.__setitem__(key, torch.zeros(shape))


CASES = {
    "rank_above_max": (lambda f: edit_config(f, r=16), r"adapter_config.json: field 'r' is 16, more than max_lora_rank 8"),
    "bias": (lambda f: edit_config(f, bias="all"), r"field 'bias' must be 'none'.*got 'all'"),
    "dora": (lambda f: edit_config(f, use_dora=True), r"field 'use_dora' must be false.*got True"),
    "modules_to_save": (lambda f: edit_config(f, modules_to_save=["lm_head"]),
                        r"field 'modules_to_save' must be empty or null.*\['lm_head'\]"),
    "rank_pattern": (lambda f: edit_config(f, rank_pattern={"q_proj": 2}), r"field 'rank_pattern'"),
    "embed_tokens_target": (lambda f: edit_config(f, target_modules=["q_proj", "embed_tokens"]),
                            r"field 'target_modules' names \['embed_tokens'\]"),
    "no_rank": (lambda f: edit_config(f, r=0), r"field 'r' must be an integer >= 1, got 0"),
    "alpha": (lambda f: edit_config(f, lora_alpha="big"), r"field 'lora_alpha' must be a positive number, got 'big'"),
    "lm_head_key": (lambda f: edit_weights(f, add_key("base_model.model.lm_head.lora_A.weight", (4, 64))),
                    r"key 'base_model.model.lm_head.lora_A.weight' is not a LoRA A/B weight"),
    "embedding_key": (lambda f: edit_weights(f, add_key("base_model.model.model.embed_tokens.lora_embedding_A",
                                                        (4, 512))), r"key '.*embed_tokens.lora_embedding_A'"),
    "dora_key": (lambda f: edit_weights(f, add_key(
        "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector.weight", (64,))),
        r"lora_magnitude_vector"),
    "bias_key": (lambda f: edit_weights(f, add_key("base_model.model.model.layers.0.self_attn.q_proj.lora_B.bias",
                                                   (64,))), r"q_proj.lora_B.bias"),
    "wrong_shape": (lambda f: edit_weights(f, add_key(LORA_A, (4, 65))),
                    r"key '.*q_proj.lora_A.weight' has shape \(4, 65\), expected \(4, 64\)"),
    "layer_out_of_range": (lambda f: edit_weights(f, add_key(LORA_A.replace("layers.0", "layers.7"), (4, 64))),
                           r"layer 7, but the model has 2 layers"),
    "missing_b": (lambda f: edit_weights(f, lambda t: t.pop(LORA_A.replace("lora_A", "lora_B"))),
                  r"layer 0's q_proj has no lora_B.weight"),
    "missing_weights": (lambda f: (f / "adapter_model.safetensors").unlink(),
                        r"adapter_model.safetensors' does not exist"),
    "missing_config": (lambda f: (f / "adapter_config.json").unlink(), r"adapter_config.json' does not exist"),
    "bad_json": (lambda f: (f / "adapter_config.json").write_text("{r: 4"), r"cannot read .*adapter_config.json"),
    "corrupt_weights": (lambda f: (f / "adapter_model.safetensors").write_bytes(b"junk"),
                        r"cannot read LoRA adapter file .*adapter_model.safetensors"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_adapter_is_refused_when_added_and_leaves_the_engine_healthy(llm, adapter, case):
    damage, message = CASES[case]
    damage(adapter)
    bad = LoRARequest(f"bad-{case}", 90, str(adapter))
    with pytest.raises(ValueError, match=r"prompt 1: lora_request 'bad-" + case + "': .*" + message):
        llm.generate([[5, 6, 7], [8, 9, 10]], PARAMS, use_tqdm=False, lora_request=[None, bad])
    assert not llm.engine_core.has_work()
    manager = llm.scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks
    assert len(llm.generate([[5, 6, 7]], PARAMS, use_tqdm=False)[0].outputs[0].token_ids) == 4


def test_a_missing_folder_is_named(llm, tmp_path):
    with pytest.raises(ValueError, match=r"LoRA adapter folder '.*nowhere' does not exist"):
        llm.generate([[5, 6]], PARAMS, use_tqdm=False, lora_request=LoRARequest("x", 91, str(tmp_path / "nowhere")))


def test_one_id_for_two_adapters_is_refused(llm, tiny_llama_path, tmp_path):
    first = make_lora_adapter(tmp_path / "first", tiny_llama_path, rank=4, seed=1)
    second = make_lora_adapter(tmp_path / "second", tiny_llama_path, rank=4, seed=2)
    llm.generate([[5, 6]], PARAMS, use_tqdm=False, lora_request=LoRARequest("first", 5, str(first)))
    with pytest.raises(ValueError, match=r"lora_int_id 5 is adapter 'first' at .*first'; it cannot also be "
                                         r"'second'"):
        llm.generate([[5, 6]], PARAMS, use_tqdm=False, lora_request=LoRARequest("second", 5, str(second)))
    with pytest.raises(ValueError, match=r"lora_int_id 5 is adapter 'first'.*cannot also be 'first' at .*second'"):
        llm.generate([[5, 6]], PARAMS, use_tqdm=False, lora_request=LoRARequest("first", 5, str(second)))
    with pytest.raises(ValueError, match=r"lora_name 'first' is adapter lora_int_id 5; it cannot also be "
                                         r"lora_int_id 6"):
        llm.generate([[5, 6]], PARAMS, use_tqdm=False, lora_request=LoRARequest("first", 6, str(first)))


def test_a_removed_adapter_releases_its_name_but_never_its_id(llm, tiny_llama_path, tmp_path):
    """What the server's unload asks of the runner: the name may come back as a new adapter under a new id,
    the old id keeps naming the old adapter (requests still running with it go on), and no id is reused."""
    first = make_lora_adapter(tmp_path / "first", tiny_llama_path, rank=4, seed=1)
    second = make_lora_adapter(tmp_path / "second", tiny_llama_path, rank=4, seed=2)
    old, new = LoRARequest("again", 11, str(first)), LoRARequest("again", 12, str(second))
    old_tokens = llm.generate([[5, 6]], PARAMS, use_tqdm=False, lora_request=old)[0].outputs[0].token_ids
    cache = llm.model_runner.lora.host_cache
    assert cache.remove_lora(11) and not cache.remove_lora(99)
    new_tokens = llm.generate([[5, 6]], PARAMS, use_tqdm=False, lora_request=new)[0].outputs[0].token_ids
    assert new_tokens != old_tokens
    assert llm.generate([[5, 6]], PARAMS, use_tqdm=False, lora_request=old)[0].outputs[0].token_ids == old_tokens
    with pytest.raises(ValueError, match=r"lora_int_id 11 is adapter 'again' at .*first'; it cannot also be "):
        llm.generate([[5, 6]], PARAMS, use_tqdm=False, lora_request=LoRARequest("again", 11, str(second)))
    with pytest.raises(ValueError, match=r"lora_name 'again' is adapter lora_int_id 12; it cannot also be "
                                         r"lora_int_id 13"):
        llm.generate([[5, 6]], PARAMS, use_tqdm=False, lora_request=LoRARequest("again", 13, str(second)))


def test_lora_request_lists_are_checked(llm, adapter):
    good = LoRARequest("good", 7, str(adapter))
    with pytest.raises(ValueError, match=r"lora_request must be a LoRARequest, or a list of one per prompt \(2\)"):
        llm.generate([[5], [6]], PARAMS, use_tqdm=False, lora_request=[good])
    with pytest.raises(ValueError, match=r"lora_request\[1\] must be a LoRARequest or None, got str"):
        llm.generate([[5], [6]], PARAMS, use_tqdm=False, lora_request=[good, "good"])


def test_lora_request_without_enable_lora_is_refused(tiny_llama_path, adapter):
    llm = LLM(model=str(tiny_llama_path), num_gpu_blocks=32)
    with pytest.raises(ValueError, match=r"prompt 0: lora_request 'a' needs an engine created with enable_lora=True"):
        llm.generate([[5, 6]], PARAMS, use_tqdm=False, lora_request=LoRARequest("a", 1, str(adapter)))
    assert not llm.engine_core.has_work()


@pytest.mark.parametrize("options,message", [
    (dict(max_loras=0), r"max_loras must be an integer >= 1, got 0"),
    (dict(max_lora_rank=0), r"max_lora_rank must be an integer >= 1, got 0"),
    (dict(max_loras=2, max_cpu_loras=1), r"max_cpu_loras must be None or an integer >= max_loras \(2\), got 1"),
])
def test_bad_lora_settings_are_named(tiny_llama_path, options, message):
    with pytest.raises(ValueError, match=message):
        LLM(model=str(tiny_llama_path), enable_lora=True, num_gpu_blocks=32, **options)


def test_a_mixture_of_experts_model_is_refused_at_start(tmp_path):
    path = make_test_model(tmp_path / "mixtral", "mixtral", seed=0, with_tokenizer=False)
    with pytest.raises(ValueError, match=r"enable_lora is not supported for mixture-of-experts models "
                                         r"\(MixtralForCausalLM"):
        LLM(model=str(path), enable_lora=True, num_gpu_blocks=32, skip_tokenizer_init=True)


def test_chat_takes_a_lora_request(llm, adapter):
    lora = LoRARequest("chat-adapter", 8, str(adapter))
    messages = [{"role": "user", "content": "Name a cache."}]
    adapted = llm.chat(messages, PARAMS, use_tqdm=False, lora_request=lora)[0]
    prompt = adapted.prompt_token_ids
    direct = llm.generate([prompt], PARAMS, use_tqdm=False, lora_request=lora)[0]
    base = llm.generate([prompt], PARAMS, use_tqdm=False)[0]
    assert adapted.outputs[0].token_ids == direct.outputs[0].token_ids != base.outputs[0].token_ids


def test_a_latent_attention_model_is_refused_at_start(tmp_path):
    # Every layer dense, so what is refused is the attention (DeepSeek's MLA has no q/k/v projections).
    path = make_test_model(tmp_path / "deepseek", "deepseek_v3", seed=0, config_overrides={"first_k_dense_replace": 2})
    with pytest.raises(ValueError, match=r"enable_lora is not supported for DeepseekV3ForCausalLM: layer 0's "
                                         r"attention is MultiHeadLatentAttention"):
        LLM(model=str(path), enable_lora=True, num_gpu_blocks=32, skip_tokenizer_init=True)


def test_a_plain_mlp_model_is_refused_at_start(tmp_path):
    path = make_test_model(tmp_path / "starcoder2", "starcoder2", seed=0)
    with pytest.raises(ValueError, match=r"enable_lora is not supported for Starcoder2ForCausalLM: layer 0's MLP is "
                                         r"Starcoder2MLP, not the gated"):
        LLM(model=str(path), enable_lora=True, num_gpu_blocks=32, skip_tokenizer_init=True)
