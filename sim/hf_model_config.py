"""Reading a model's shape from its Hugging Face ``config.json``, for the architectures ``ModelShape`` models
one to one; any other is refused by name rather than priced as something it is not."""

from __future__ import annotations

import json
from pathlib import Path

from sim.model_shapes import ModelShape

# Architectures whose config.json maps onto ModelShape one to one (all: RMSNorm, RoPE, SwiGLU MLP).
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
_MODEL_TYPE_TO_ARCHITECTURE = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                               "qwen2": "Qwen2ForCausalLM"}
# What transformers assumes when a config leaves max_position_embeddings out.
_DEFAULT_MAX_POSITIONS = {"LlamaForCausalLM": 2048, "MistralForCausalLM": 4096 * 32, "Qwen2ForCausalLM": 32768}


def model_from_hf_config(path: str | Path) -> ModelShape:
    """Read the shape from a Llama / Mistral / Qwen2 ``config.json``."""
    path = Path(path)
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"model: cannot read {path} as JSON: {error}") from None
    if not isinstance(config, dict):
        raise ValueError(f"model: {path} does not hold a JSON object")
    architectures = config.get("architectures") or [_MODEL_TYPE_TO_ARCHITECTURE.get(config.get("model_type"), None)]
    architecture = next((a for a in architectures if a in SUPPORTED_ARCHITECTURES), None)
    if architecture is None:
        raise ValueError(f"model: {path}: architecture {architectures!r} (model_type {config.get('model_type')!r}) "
                         f"is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")

    def key(name: str, default: object = None) -> int:
        # Some configs write null for a key they mean to leave at its default (head_dim, for one).
        raw = config.get(name)
        raw = default if raw is None else raw
        if raw is None:
            raise ValueError(f"model: {path}: config.json lacks the key {name!r}")
        if not isinstance(raw, int) or isinstance(raw, bool) or raw < 1:
            raise ValueError(f"model: {path}: key {name!r} must be a positive integer, got {raw!r}")
        return raw

    hidden_size = key("hidden_size")
    num_heads = key("num_attention_heads")
    if config.get("hidden_act", "silu") not in ("silu", "swish"):
        raise ValueError(f"model: {path}: key 'hidden_act' is {config['hidden_act']!r}; "
                         f"only a SiLU-gated MLP is modelled")
    return ModelShape(
        name=str(config.get("_name_or_path") or path.parent.name or path.stem),
        num_layers=key("num_hidden_layers"),
        hidden_size=hidden_size,
        num_attention_heads=num_heads,
        num_kv_heads=key("num_key_value_heads", num_heads),
        head_dim=key("head_dim", hidden_size // num_heads),
        intermediate_size=key("intermediate_size"),
        vocab_size=key("vocab_size"),
        max_position_embeddings=key("max_position_embeddings", _DEFAULT_MAX_POSITIONS[architecture]),
        gated_mlp=True,
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=architecture == "Qwen2ForCausalLM" or bool(config.get("attention_bias", False)),
    )
