"""The tensor names and shapes of each architecture's Hugging Face checkpoints, as the test models
(default_model.make_test_model) write them and transformers reads them."""

from __future__ import annotations

from typing import Any


def checkpoint_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Hugging Face parameter names and shapes of a Llama-family checkpoint."""
    if config["model_type"].startswith("deepseek"):
        return _deepseek_shapes(config)
    hidden = config["hidden_size"]
    q_size = config["num_attention_heads"] * config["head_dim"]
    kv_size = config["num_key_value_heads"] * config["head_dim"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config["vocab_size"], hidden)}
    for i in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{i}"
        shapes[f"{prefix}.input_layernorm.weight"] = (hidden,)
        shapes[f"{prefix}.post_attention_layernorm.weight"] = (hidden,)
        if config["model_type"] in ("cohere", "cohere2"):  # one LayerNorm feeds attention and the MLP; q/k norms per head
            del shapes[f"{prefix}.post_attention_layernorm.weight"]
            if config.get("use_qk_norm"):
                heads, kv_heads, head_dim = (config["num_attention_heads"], config["num_key_value_heads"],
                                             config["head_dim"])
                shapes.update({f"{prefix}.self_attn.q_norm.weight": (heads, head_dim),
                               f"{prefix}.self_attn.k_norm.weight": (kv_heads, head_dim)})
        if config["model_type"] == "starcoder2":  # biases everywhere, LayerNorms with biases, a plain MLP
            width = config["intermediate_size"]
            for name, shape in (("self_attn.q_proj", (q_size, hidden)), ("self_attn.k_proj", (kv_size, hidden)),
                                ("self_attn.v_proj", (kv_size, hidden)), ("self_attn.o_proj", (hidden, q_size)),
                                ("mlp.c_fc", (width, hidden)), ("mlp.c_proj", (hidden, width))):
                shapes[f"{prefix}.{name}.weight"], shapes[f"{prefix}.{name}.bias"] = shape, shape[:1]
            shapes[f"{prefix}.input_layernorm.bias"] = shapes[f"{prefix}.post_attention_layernorm.bias"] = (hidden,)
            shapes["model.norm.bias"] = (hidden,)
            continue
        if config["model_type"] == "glm4_moe":  # biases on q, k, v only; per-head q/k norms; DeepSeek's MLP
            shapes.update({f"{prefix}.self_attn.q_proj.weight": (q_size, hidden),
                           f"{prefix}.self_attn.k_proj.weight": (kv_size, hidden),
                           f"{prefix}.self_attn.v_proj.weight": (kv_size, hidden),
                           f"{prefix}.self_attn.o_proj.weight": (hidden, q_size), **deepseek_mlp_shapes(config, i)})
            if config.get("attention_bias"):
                shapes.update({f"{prefix}.self_attn.q_proj.bias": (q_size,), f"{prefix}.self_attn.k_proj.bias": (kv_size,),
                               f"{prefix}.self_attn.v_proj.bias": (kv_size,)})
            if config.get("use_qk_norm"):
                shapes.update({f"{prefix}.self_attn.q_norm.weight": (config["head_dim"],),
                               f"{prefix}.self_attn.k_norm.weight": (config["head_dim"],)})
            continue
        if config["model_type"] == "exaone4":  # norms after the blocks, none before (per-head q/k norms: _has_qk_norm)
            del shapes[f"{prefix}.input_layernorm.weight"]
            shapes[f"{prefix}.post_feedforward_layernorm.weight"] = (hidden,)
        if config["model_type"] in ("olmo2", "olmo3"):  # norms after the blocks, none before; q and k normalized whole
            del shapes[f"{prefix}.input_layernorm.weight"]
            shapes.update({f"{prefix}.post_feedforward_layernorm.weight": (hidden,),
                           f"{prefix}.self_attn.q_norm.weight": (q_size,), f"{prefix}.self_attn.k_norm.weight": (kv_size,)})
        if config["model_type"] == "glm4":  # each block's output normalized too
            shapes.update({f"{prefix}.post_self_attn_layernorm.weight": (hidden,),
                           f"{prefix}.post_mlp_layernorm.weight": (hidden,)})
        if config["model_type"] == "phi3":  # stored fused: [q; k; v] and [gate; up]
            width = config["intermediate_size"]
            shapes.update({f"{prefix}.self_attn.qkv_proj.weight": (q_size + 2 * kv_size, hidden),
                           f"{prefix}.self_attn.o_proj.weight": (hidden, q_size),
                           f"{prefix}.mlp.gate_up_proj.weight": (2 * width, hidden),
                           f"{prefix}.mlp.down_proj.weight": (hidden, width)})
            continue
        shapes[f"{prefix}.self_attn.q_proj.weight"] = (q_size, hidden)
        shapes[f"{prefix}.self_attn.k_proj.weight"] = (kv_size, hidden)
        shapes[f"{prefix}.self_attn.v_proj.weight"] = (kv_size, hidden)
        shapes[f"{prefix}.self_attn.o_proj.weight"] = (hidden, q_size)
        if config.get("attention_bias", config.get("qkv_bias")):
            shapes[f"{prefix}.self_attn.q_proj.bias"] = (q_size,)
            shapes[f"{prefix}.self_attn.k_proj.bias"] = (kv_size,)
            shapes[f"{prefix}.self_attn.v_proj.bias"] = (kv_size,)
        if config["model_type"] == "internlm3" and config.get("attention_bias", config.get("qkv_bias")):
            shapes[f"{prefix}.self_attn.o_proj.bias"] = (hidden,)  # Llama's switch: the output projection's too
        if config["model_type"] == "internlm3" and config.get("mlp_bias", config.get("bias")):
            width = config["intermediate_size"]
            shapes.update({f"{prefix}.mlp.gate_proj.bias": (width,), f"{prefix}.mlp.up_proj.bias": (width,),
                           f"{prefix}.mlp.down_proj.bias": (hidden,)})
        if config.get("use_bias") and config["model_type"] == "ernie4_5":  # one switch for every projection's bias
            width = config["intermediate_size"]
            shapes.update({f"{prefix}.self_attn.q_proj.bias": (q_size,), f"{prefix}.self_attn.k_proj.bias": (kv_size,),
                           f"{prefix}.self_attn.v_proj.bias": (kv_size,), f"{prefix}.self_attn.o_proj.bias": (hidden,),
                           f"{prefix}.mlp.gate_proj.bias": (width,), f"{prefix}.mlp.up_proj.bias": (width,),
                           f"{prefix}.mlp.down_proj.bias": (hidden,)})
        if config.get("attention_out_bias"):  # Seed-OSS: the output projection's bias has a switch of its own
            shapes[f"{prefix}.self_attn.o_proj.bias"] = (hidden,)
        if config["model_type"] == "gpt_oss":  # the output projection's bias and the heads' sinks
            shapes[f"{prefix}.self_attn.o_proj.bias"] = (hidden,)
            shapes[f"{prefix}.self_attn.sinks"] = (config["num_attention_heads"],)
        if _has_qk_norm(config):  # Hunyuan names its per-head norms query_layernorm and key_layernorm
            q_norm, k_norm = (("query_layernorm", "key_layernorm") if config["model_type"] == "hunyuan_v1_dense"
                              else ("q_norm", "k_norm"))
            shapes[f"{prefix}.self_attn.{q_norm}.weight"] = (config["head_dim"],)
            shapes[f"{prefix}.self_attn.{k_norm}.weight"] = (config["head_dim"],)
        shapes.update(_mlp_weight_shapes(config, prefix))
    shapes["model.norm.weight"] = (hidden,)
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (config["vocab_size"], hidden)
    return shapes


def _has_qk_norm(config: dict[str, Any]) -> bool:
    """Whether the architecture's model class normalizes each head of q and k (Qwen3): the class says so."""
    from engine.models.registry import MODEL_REGISTRY  # the model classes, not needed to write weights otherwise
    return MODEL_REGISTRY[config["architectures"][0]].qk_norm


def _mlp_weight_shapes(config: dict[str, Any], prefix: str) -> dict[str, tuple[int, ...]]:
    """One layer's MLP tensors, named as each architecture's checkpoints name them."""
    hidden = config["hidden_size"]

    def swiglu(module: str, width: int, names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")):
        gate, up, down = names
        return {f"{module}.{gate}.weight": (width, hidden), f"{module}.{up}.weight": (width, hidden),
                f"{module}.{down}.weight": (hidden, width)}

    if config["model_type"] == "mixtral":
        shapes = {f"{prefix}.block_sparse_moe.gate.weight": (config["num_local_experts"], hidden)}
        for expert in range(config["num_local_experts"]):
            shapes.update(swiglu(f"{prefix}.block_sparse_moe.experts.{expert}", config["intermediate_size"],
                                 ("w1", "w3", "w2")))
        return shapes
    if config["model_type"] in ("qwen2_moe", "qwen3_moe"):
        shapes = {f"{prefix}.mlp.gate.weight": (config["num_experts"], hidden)}
        for expert in range(config["num_experts"]):
            shapes.update(swiglu(f"{prefix}.mlp.experts.{expert}", config["moe_intermediate_size"]))
        if config["model_type"] == "qwen2_moe":
            shapes[f"{prefix}.mlp.shared_expert_gate.weight"] = (1, hidden)
            shapes.update(swiglu(f"{prefix}.mlp.shared_expert", config["shared_expert_intermediate_size"]))
        return shapes
    if config["model_type"] == "gpt_oss":  # transformers' stacked layout (engine/models/gpt_oss.py)
        experts, width = config["num_local_experts"], config["intermediate_size"]
        return {f"{prefix}.mlp.router.weight": (experts, hidden), f"{prefix}.mlp.router.bias": (experts,),
                f"{prefix}.mlp.experts.gate_up_proj": (experts, hidden, 2 * width),
                f"{prefix}.mlp.experts.gate_up_proj_bias": (experts, 2 * width),
                f"{prefix}.mlp.experts.down_proj": (experts, width, hidden),
                f"{prefix}.mlp.experts.down_proj_bias": (experts, hidden)}
    if config["model_type"] in ("glm", "glm4"):  # gate and up stored fused, [gate; up]
        width = config["intermediate_size"]
        return {f"{prefix}.mlp.gate_up_proj.weight": (2 * width, hidden), f"{prefix}.mlp.down_proj.weight": (hidden, width)}
    return swiglu(f"{prefix}.mlp", config["intermediate_size"])


def _deepseek_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """A DeepSeek checkpoint's names and shapes (engine/models/deepseek.py): latent attention, then a dense MLP
    for the first first_k_dense_replace layers and routed plus shared experts for the others."""
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    qk_head_dim = config["qk_nope_head_dim"] + config["qk_rope_head_dim"]
    rank = config["kv_lora_rank"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config["vocab_size"], hidden),
                                          "model.norm.weight": (hidden,)}
    for i in range(config["num_hidden_layers"]):
        attention = f"model.layers.{i}.self_attn"
        shapes[f"model.layers.{i}.input_layernorm.weight"] = (hidden,)
        shapes[f"model.layers.{i}.post_attention_layernorm.weight"] = (hidden,)
        if config.get("q_lora_rank") is None:
            shapes[f"{attention}.q_proj.weight"] = (heads * qk_head_dim, hidden)
        else:
            shapes[f"{attention}.q_a_proj.weight"] = (config["q_lora_rank"], hidden)
            shapes[f"{attention}.q_a_layernorm.weight"] = (config["q_lora_rank"],)
            shapes[f"{attention}.q_b_proj.weight"] = (heads * qk_head_dim, config["q_lora_rank"])
        shapes[f"{attention}.kv_a_proj_with_mqa.weight"] = (rank + config["qk_rope_head_dim"], hidden)
        shapes[f"{attention}.kv_a_layernorm.weight"] = (rank,)
        shapes[f"{attention}.kv_b_proj.weight"] = (heads * (config["qk_nope_head_dim"] + config["v_head_dim"]), rank)
        shapes[f"{attention}.o_proj.weight"] = (hidden, heads * config["v_head_dim"])
        shapes.update(deepseek_mlp_shapes(config, i))
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (config["vocab_size"], hidden)
    return shapes


def deepseek_mlp_shapes(config: dict[str, Any], i: int) -> dict[str, tuple[int, ...]]:
    """Layer ``i``'s MLP in DeepSeek's layout (GLM-4.5's too): dense for the first first_k_dense_replace layers,
    else routed experts, shared experts and the router (with V3's correction bias)."""
    hidden, width, mlp = config["hidden_size"], config["moe_intermediate_size"], f"model.layers.{i}.mlp"
    shapes: dict[str, tuple[int, ...]] = {}
    mlps = {mlp: config["intermediate_size"]} if i < config["first_k_dense_replace"] else {
        **{f"{mlp}.experts.{e}": width for e in range(config["n_routed_experts"])},
        f"{mlp}.shared_experts": width * config["n_shared_experts"]}
    for module, size in mlps.items():
        shapes.update({f"{module}.gate_proj.weight": (size, hidden), f"{module}.up_proj.weight": (size, hidden),
                       f"{module}.down_proj.weight": (hidden, size)})
    if i >= config["first_k_dense_replace"]:
        shapes[f"{mlp}.gate.weight"] = (config["n_routed_experts"], hidden)
        if config["model_type"] in ("deepseek_v3", "glm4_moe"):
            shapes[f"{mlp}.gate.e_score_correction_bias"] = (config["n_routed_experts"],)
    return shapes
