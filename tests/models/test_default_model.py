"""The offline default model: generated locally, deterministic, an ordinary HF folder, atomic."""

import hashlib
import json
import os
import subprocess
import sys

import pytest
import torch

from engine.models import default_model_path, load_model, load_tokenizer, make_test_model


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("servesim-cache")


def test_tiny_is_a_complete_hf_folder(cache_dir):
    path = default_model_path("tiny", cache_dir=cache_dir)
    assert path.parent == cache_dir / "models" and path.name.startswith("servesim-tiny-llama-")
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                 "tokenizer_config.json"):
        assert (path / name).is_file(), name
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"],
            config["num_key_value_heads"], config["max_position_embeddings"]) == (2, 64, 4, 2, 2048)
    assert not [p for p in cache_dir.joinpath("models").iterdir() if p.name.startswith(".")]  # no staging left
    assert default_model_path("tiny", cache_dir=cache_dir) == path  # reused, not rebuilt


def test_tokenizer(cache_dir):
    path = default_model_path("tiny", cache_dir=cache_dir)
    tokenizer = load_tokenizer(path)
    config = json.loads((path / "config.json").read_text())
    assert len(tokenizer) == config["vocab_size"] == 512
    assert (tokenizer.unk_token, tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == (
        "<unk>", "<s>", "</s>", "<pad>")
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (config["bos_token_id"], config["eos_token_id"])
    text = "The engine schedules 42 requests, naïvely; ünïcode too!"
    ids = tokenizer(text).input_ids
    assert ids[0] == tokenizer.bos_token_id and len(ids) < len(text.encode())
    assert tokenizer.decode(ids, skip_special_tokens=True) == text  # byte-level: lossless on any text
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                           add_generation_prompt=True)
    assert prompt == "<s>user: hi\nassistant:"


def test_weights_are_not_degenerate(cache_dir):
    model, config = load_model(default_model_path("tiny", cache_dir=cache_dir), torch.float32, "cpu")
    std = model.model.layers[0].self_attn.qkv_proj.weight.std().item()
    assert 0.015 < std < 0.025
    assert model.lm_head is not None and not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)


def test_deterministic_across_processes(cache_dir, tmp_path):
    path = default_model_path("tiny", cache_dir=cache_dir)
    other_cache = tmp_path / "other"
    script = ("import sys; from engine.models import default_model_path; "
              "print(default_model_path('tiny'))")
    env = {**os.environ, "SERVESIM_CACHE": str(other_cache)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    other = other_cache / "models" / path.name
    assert out.stdout.strip() == str(other)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert _sha(path / name) == _sha(other / name), name


def test_make_test_model_is_deterministic_and_seeded(tmp_path):
    a = make_test_model(tmp_path / "a", "qwen2", seed=1)
    b = make_test_model(tmp_path / "b", "qwen2", seed=1)
    c = make_test_model(tmp_path / "c", "qwen2", seed=2)
    assert _sha(a / "model.safetensors") == _sha(b / "model.safetensors") != _sha(c / "model.safetensors")
    tied = make_test_model(tmp_path / "tied", "llama", tie_word_embeddings=True)
    model, _ = load_model(tied)
    assert model.lm_head is None


def test_small_size(cache_dir):
    path = default_model_path("small", cache_dir=cache_dir)
    model, config = load_model(path, torch.bfloat16, "cpu")
    num_params = sum(p.numel() for p in model.parameters())
    assert 20e6 < num_params < 60e6
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (8, 512, 8192)
    assert len(load_tokenizer(path)) == 8192


def test_unknown_size():
    with pytest.raises(ValueError, match="'huge'"):
        default_model_path("huge")
