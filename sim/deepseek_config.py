"""Reading a DeepSeek-V2 / DeepSeek-V3 ``config.json`` (also DeepSeek-R1 and Kimi K2, which share V3's
architecture) into a ``ModelShape``: multi-head latent attention (sim/latent_attention.py), dense MLPs in the
first ``first_k_dense_replace`` layers, routed experts with ungated shared experts in the rest. GLM-4.5's
(``Glm4MoeForCausalLM``) has the same mixture of experts with grouped-query attention (its q/k norms and half-width
RoPE cost nothing the roofline sees).

Read as transformers' DeepseekV2Config / DeepseekV3Config read them (a key left out takes those classes'
default; V2's expert keys have none and must be there for a mixture of experts). Left out of the parameter
counts as vLLM leaves it out of a served model: V3's multi-token-prediction module (``num_nextn_predict_layers``,
kept as ``num_mtp_layers``: loaded only as a speculative draft, method mtp, sim/mtp_draft.py). The router's group-limited top-k (``n_group``,
``topk_group``) picks each expert with the same chance k / E as an unrestricted one, which is all the uniform
routing model reads (sim/cost_models/routed_experts.py), so it is accepted as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sim.hf_checkpoint_quantization import stored_quantization
from sim.model_shapes import ModelShape

# transformers' defaults for the keys a config may leave out (None: it must be there).
_DEFAULTS = {
    "DeepseekV3ForCausalLM": {"n_routed_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 2048,
                              "n_shared_experts": 1, "first_k_dense_replace": 3, "kv_lora_rank": 512,
                              "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                              "v_head_dim": 128, "max_position_embeddings": 4096},
    "DeepseekV2ForCausalLM": {"n_routed_experts": None, "num_experts_per_tok": None, "moe_intermediate_size": 1407,
                              "n_shared_experts": None, "first_k_dense_replace": 0, "kv_lora_rank": 512,
                              "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                              "v_head_dim": 128, "max_position_embeddings": 2048},
    "Glm4MoeForCausalLM": {"n_routed_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 1408,
                           "n_shared_experts": 1, "first_k_dense_replace": 1, "max_position_embeddings": 131072,
                           "num_nextn_predict_layers": 1},
}


def deepseek_shape(config: dict, architecture: str, path: Path, key: Callable[..., int]) -> ModelShape:
    """The shape of a DeepSeek-V2/V3 ``config``; ``key(name, default)`` reads a positive integer or refuses it
    naming ``path`` and the key."""
    defaults = _DEFAULTS[architecture]
    if config.get("hidden_act", "silu") not in ("silu", "swish"):
        raise ValueError(f"model: {path}: key 'hidden_act' is {config['hidden_act']!r}; only a SiLU-gated MLP is "
                         "modelled")
    latent = architecture != "Glm4MoeForCausalLM"
    if latent and config.get("attention_bias"):
        raise ValueError(f"model: {path}: key 'attention_bias' is true; latent attention is modelled without biases")
    frequency = config.get("moe_layer_freq", 1)
    if frequency != 1:
        raise ValueError(f"model: {path}: key 'moe_layer_freq' is {frequency!r}; only 1 (experts in every layer "
                         "after the dense ones) is modelled")
    num_layers = key("num_hidden_layers")
    hidden_size = key("hidden_size")
    heads = key("num_attention_heads")
    return ModelShape(
        name=str(config.get("_name_or_path") or path.parent.name or path.stem),
        num_layers=num_layers,
        hidden_size=hidden_size,
        num_attention_heads=heads,
        intermediate_size=key("intermediate_size"),
        vocab_size=key("vocab_size"),
        max_position_embeddings=key("max_position_embeddings", defaults["max_position_embeddings"]),
        gated_mlp=True,
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        num_mtp_layers=_mtp_layers(config, path, defaults.get("num_nextn_predict_layers", 0)),
        stored_quantization=stored_quantization(config, path),  # DeepSeek-V3/R1 and Kimi K2: block fp8
        **(_latent_attention(config, defaults, key, heads) if latent else {
            "num_kv_heads": key("num_key_value_heads", heads), "head_dim": key("head_dim", hidden_size // heads),
            "qkv_bias": bool(config.get("attention_bias", False))}),
        **_experts(config, architecture, path, key, num_layers),
    )


def _latent_attention(config: dict, defaults: dict, key: Callable[..., int], heads: int) -> dict:
    rope = key("qk_rope_head_dim", defaults["qk_rope_head_dim"])
    # q_lora_rank null: one full-rank query projection (DeepSeek-V2-Lite).
    q_lora_rank = 0 if "q_lora_rank" in config and config["q_lora_rank"] is None \
        else key("q_lora_rank", defaults["q_lora_rank"])
    return {"num_kv_heads": heads,  # every head reads the one latent; the config's num_key_value_heads is not used
            "head_dim": key("qk_nope_head_dim", defaults["qk_nope_head_dim"]) + rope,
            "kv_lora_rank": key("kv_lora_rank", defaults["kv_lora_rank"]), "q_lora_rank": q_lora_rank,
            "qk_rope_head_dim": rope, "v_head_dim": key("v_head_dim", defaults["v_head_dim"])}


def _mtp_layers(config: dict, path: Path, default: int) -> int:
    """``num_nextn_predict_layers`` (``default`` when left out: DeepSeek's config classes have none, GLM's one)."""
    layers = config.get("num_nextn_predict_layers", default) or 0
    if not isinstance(layers, int) or isinstance(layers, bool) or layers < 0:
        raise ValueError(f"model: {path}: key 'num_nextn_predict_layers' must be an integer >= 0, got {layers!r}")
    return layers


def _experts(config: dict, architecture: str, path: Path, key: Callable[..., int], num_layers: int) -> dict:
    """The expert fields; {} for a config without routed experts (n_routed_experts null or 0: dense layers)."""
    defaults = _DEFAULTS[architecture]
    routed = config.get("n_routed_experts", defaults["n_routed_experts"])
    if not routed:
        return {}
    width = key("moe_intermediate_size", defaults["moe_intermediate_size"])
    shared = config.get("n_shared_experts", defaults["n_shared_experts"]) or 0
    if not isinstance(shared, int) or isinstance(shared, bool) or shared < 0:
        raise ValueError(f"model: {path}: key 'n_shared_experts' must be an integer >= 0 or null, got {shared!r}")
    dense = config.get("first_k_dense_replace", defaults["first_k_dense_replace"]) or 0
    if not isinstance(dense, int) or isinstance(dense, bool) or not 0 <= dense < num_layers:
        raise ValueError(f"model: {path}: key 'first_k_dense_replace' must be 0..num_hidden_layers - 1 "
                         f"({num_layers - 1}) for a mixture of experts, got {dense!r}")
    experts = key("n_routed_experts")
    per_token = key("num_experts_per_tok", defaults["num_experts_per_tok"])
    if per_token > experts:
        raise ValueError(f"model: {path}: key 'num_experts_per_tok' is {per_token}, more than the {experts} experts "
                         "('n_routed_experts')")
    # vLLM runs a layer's shared experts as one MLP of their widths together.
    return {"num_experts": experts, "num_experts_per_token": per_token, "moe_intermediate_size": width,
            "shared_expert_intermediate_size": shared * width, "shared_expert_gate": False,
            "num_dense_layers": dense}
