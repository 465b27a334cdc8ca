"""Llama 4's config.json as a ModelShape (Scout: experts in every layer; Maverick: every other layer), its language
model for ``Llama4ForConditionalGeneration`` (the engine serves it text in, text out: engine/models/llama4_config.py).

Each MoE layer: ``num_local_experts`` experts of width ``intermediate_size``, top-``num_experts_per_tok``, and an
ungated shared expert of the same width; the other layers a dense MLP of ``intermediate_size_mlp``, counted as the
shape's ``num_dense_layers`` (their place among the layers changes no step's cost; a pipeline stage boundary would
see them first). The layers with RoPE (``no_rope_layers``' ones, three in four) attend within chunks of
``attention_chunk_size`` tokens (sim/cost_models/step_batch.py prices them so). Not modelled: the vision tower.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sim.hf_checkpoint_quantization import stored_quantization
from sim.model_shapes import ModelShape

LLAMA4_ARCHITECTURES = ("Llama4ForCausalLM", "Llama4ForConditionalGeneration")


def llama4_text_config(config: dict, path: Path) -> dict:
    if config.get("model_type") != "llama4":
        return config
    text = config.get("text_config")
    if not isinstance(text, dict):
        raise ValueError(f"model: {path}: a llama4 config needs its language model's keys in 'text_config'")
    return {**text, "quantization_config": config.get("quantization_config"),
            "_name_or_path": config.get("_name_or_path")}


def llama4_shape(config: dict, path: Path, key: Callable[..., int]) -> ModelShape:
    """``config``: the language model's keys (``llama4_text_config``), which ``key`` reads too."""
    num_layers = key("num_hidden_layers", 48)
    step = key("interleave_moe_layer_step", 1)
    moe_layers = config.get("moe_layers")
    moe_layers = list(range(step - 1, num_layers, step)) if moe_layers is None else moe_layers
    width = key("intermediate_size", 8192)
    interval = key("no_rope_layer_interval", 4)
    uses_rope = config.get("no_rope_layers") or [int((index + 1) % interval != 0) for index in range(num_layers)]
    chunk = config.get("attention_chunk_size", 8192)
    hidden, heads = key("hidden_size", 5120), key("num_attention_heads", 40)
    return ModelShape(
        name=str(config.get("_name_or_path") or path.parent.name or path.stem), num_layers=num_layers,
        hidden_size=hidden, num_attention_heads=heads, num_kv_heads=key("num_key_value_heads", 8),
        head_dim=key("head_dim", 128), intermediate_size=key("intermediate_size_mlp", 16384),
        vocab_size=key("vocab_size", 202048), max_position_embeddings=key("max_position_embeddings", 4096 * 32),
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=bool(config.get("attention_bias", False)), num_experts=key("num_local_experts", 16),
        num_experts_per_token=key("num_experts_per_tok", 1), moe_intermediate_size=width,
        shared_expert_intermediate_size=width, shared_expert_gate=False,
        num_dense_layers=num_layers - len(moe_layers), stored_quantization=stored_quantization(config, path),
        attention_chunk_size=chunk if chunk and sum(uses_rope) else None,
        num_chunked_layers=sum(uses_rope) if chunk and sum(uses_rope) else None)
