"""What a DeepSeek-V2 / V3 config.json (and Kimi K2's, a DeepSeek-V3) says beyond the Llama fields.

Two things differ from the Llama family:

* **Multi-head latent attention (MLA).** Keys and values are not cached per head: each token caches one latent
  vector of ``kv_lora_rank`` features (normalized) and one RoPE key of ``qk_rope_head_dim`` features shared by all
  heads; a head's key and value are projections of the latent (``kv_b_proj``). So, to the KV cache, an MLA model
  has one KV head of ``kv_lora_rank + qk_rope_head_dim`` features and no separate values
  (``ModelConfig.value_head_dim`` 0): 576 numbers per token and layer for DeepSeek-V3, where its 128 heads'
  keys and values would be 40,960.
* **DeepSeek's mixture of experts.** Routed experts and always-on shared experts (``n_shared_experts`` of
  ``moe_intermediate_size`` each, summed into one MLP), the first ``first_k_dense_replace`` layers dense. V3
  scores experts with a sigmoid, adds a per-expert correction bias for the choice only, first keeps the
  ``topk_group`` best of ``n_group`` expert groups (a group's score: its two best experts), and scales the
  chosen weights by ``routed_scaling_factor``; V2 scores with a softmax and keeps groups by their best expert
  (``topk_method: group_limited_greedy``) or not at all (``greedy``).

Defaults for absent keys are transformers' (DeepseekV3Config, DeepseekV2Config).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.models.rotary_embedding import yarn_mscale

DEEPSEEK_MODEL_TYPES = ("deepseek_v2", "deepseek_v3", "kimi_k2")

_V3 = dict(n_routed_experts=256, num_experts_per_tok=8, moe_intermediate_size=2048, n_shared_experts=1,
           routed_scaling_factor=2.5, n_group=8, topk_group=4, first_k_dense_replace=3, norm_topk_prob=True,
           kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128,
           topk_method="noaux_tc", rope_interleave=True)
_V2 = dict(n_routed_experts=64, num_experts_per_tok=None, moe_intermediate_size=1407, n_shared_experts=2,
           routed_scaling_factor=1.0, n_group=None, topk_group=None, first_k_dense_replace=0, norm_topk_prob=False,
           kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128,
           topk_method="greedy", rope_interleave=True)
# GLM-4.5's experts are DeepSeek-V3's (transformers' Glm4MoeConfig defaults); its attention is grouped-query.
_GLM4_MOE = dict(_V3, n_routed_experts=128, num_experts_per_tok=8, moe_intermediate_size=1408, n_shared_experts=1,
                 routed_scaling_factor=1.0, n_group=1, topk_group=1, first_k_dense_replace=1, norm_topk_prob=True)
_DEFAULTS = {"deepseek_v2": _V2, "deepseek_v3": _V3, "kimi_k2": _V3, "glm4_moe": _GLM4_MOE}
_TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")


@dataclass(frozen=True)
class MLAConfig:
    """Multi-head latent attention's dimensions (module docstring)."""
    q_lora_rank: int | None  # None: queries come from one projection (q_proj), as in DeepSeek-V2-Lite
    kv_lora_rank: int
    qk_nope_head_dim: int  # a head's key features that carry no position (read from the latent)
    qk_rope_head_dim: int  # the RoPE key features, one set shared by all heads
    v_head_dim: int
    rope_interleave: bool  # RoPE rotates adjacent pairs (x0, x1), (x2, x3) ... rather than halves
    softmax_scale: float  # 1 / sqrt(qk head dim), times YaRN's mscale_all_dim correction squared

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def cache_width(self) -> int:
        """Features one token caches per layer: the latent and the shared RoPE key."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True)
class DeepseekRouting:
    """How a DeepSeek router picks and weighs experts (module docstring)."""
    scoring: str  # "sigmoid" (V3) or "softmax" (V2)
    num_groups: int  # 1: no group stage
    top_k_groups: int
    group_score: str  # "top2_sum" (V3's noaux_tc) or "max" (V2's group_limited_greedy)
    score_correction_bias: bool  # V3: a per-expert bias (mlp.gate.e_score_correction_bias) added for the choice
    routed_scaling_factor: float


def _value(raw: dict[str, Any], key: str, defaults: dict[str, Any]) -> Any:
    return raw[key] if raw.get(key) is not None else defaults[key]


def _positive_int(raw: dict[str, Any], key: str, defaults: dict[str, Any]) -> int:
    value = _value(raw, key, defaults)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"config.json: {key} must be a positive integer, got {value!r}")
    return value


def parse_mla(raw: dict[str, Any], model_type: str, rope_scaling: dict[str, Any] | None) -> MLAConfig:
    defaults = _DEFAULTS[model_type]
    heads, kv_heads = raw["num_attention_heads"], raw.get("num_key_value_heads")
    if kv_heads not in (None, heads):
        # Each head's key and value are read from the latent: transformers' MLA has no grouping of heads.
        raise ValueError(f"config.json: num_key_value_heads={kv_heads} differs from num_attention_heads={heads}; "
                         "under multi-head latent attention every head has its own key and value")
    q_lora_rank = raw.get("q_lora_rank", defaults["q_lora_rank"])
    if q_lora_rank is not None:
        q_lora_rank = _positive_int(raw, "q_lora_rank", defaults)
    qk_nope, qk_rope = (_positive_int(raw, "qk_nope_head_dim", defaults), _positive_int(raw, "qk_rope_head_dim", defaults))
    if qk_rope % 2:
        raise ValueError(f"config.json: qk_rope_head_dim must be even (RoPE rotates pairs), got {qk_rope}")
    scale = (qk_nope + qk_rope) ** -0.5
    if rope_scaling is not None and rope_scaling.get("mscale_all_dim"):
        # DeepSeek folds YaRN's whole-dimension correction into the softmax scale, squared (q and k each).
        scale *= yarn_mscale(float(rope_scaling["factor"]), float(rope_scaling["mscale_all_dim"])) ** 2
    return MLAConfig(q_lora_rank=q_lora_rank, kv_lora_rank=_positive_int(raw, "kv_lora_rank", defaults),
                     qk_nope_head_dim=qk_nope, qk_rope_head_dim=qk_rope,
                     v_head_dim=_positive_int(raw, "v_head_dim", defaults),
                     # transformers' DeepSeek-V2 always rotates pairs; V3 reads the key (default true).
                     rope_interleave=True if model_type == "deepseek_v2" else bool(_value(raw, "rope_interleave", defaults)),
                     softmax_scale=scale)


def parse_deepseek_moe(raw: dict[str, Any], model_type: str, num_layers: int) -> dict[str, Any]:
    """The keyword arguments of a ``MoEConfig`` for a DeepSeek config (config.py builds it)."""
    defaults = _DEFAULTS[model_type]
    num_experts = _positive_int(raw, "n_routed_experts", defaults)
    if model_type == "deepseek_v2" and raw.get("num_experts_per_tok") is None:
        raise ValueError("config.json: num_experts_per_tok must be a positive integer, got None")
    top_k = _positive_int(raw, "num_experts_per_tok", defaults)
    if top_k > num_experts:
        raise ValueError(f"config.json: num_experts_per_tok={top_k} exceeds the {num_experts} experts")
    method = _value(raw, "topk_method", defaults)
    if method not in _TOPK_METHODS:
        raise ValueError(f"config.json: topk_method must be one of {', '.join(_TOPK_METHODS)}, got {method!r}")
    if model_type == "deepseek_v2" and method == "noaux_tc":
        raise ValueError("config.json: topk_method 'noaux_tc' is DeepSeek-V3's; a deepseek_v2 config has greedy "
                         "or group_limited_greedy")
    if model_type != "deepseek_v2":
        method = "noaux_tc"  # transformers' V3 router always routes this way, whatever the key says
    num_groups, top_k_groups = 1, 1
    if method != "greedy":
        num_groups, top_k_groups = _positive_int(raw, "n_group", defaults), _positive_int(raw, "topk_group", defaults)
        if num_experts % num_groups:
            raise ValueError(f"config.json: n_group={num_groups} does not divide the {num_experts} routed experts")
        if top_k_groups > num_groups:
            raise ValueError(f"config.json: topk_group={top_k_groups} exceeds n_group={num_groups}")
        if method == "noaux_tc" and num_experts // num_groups < 2:
            raise ValueError(f"config.json: n_group={num_groups} leaves fewer than 2 experts a group; a group's "
                             "score is its two best experts'")
        if top_k > top_k_groups * (num_experts // num_groups):
            raise ValueError(f"config.json: num_experts_per_tok={top_k} exceeds the experts of the topk_group="
                             f"{top_k_groups} groups kept")
    first_dense = _value(raw, "first_k_dense_replace", defaults)
    frequency = raw.get("moe_layer_freq", 1)
    if not isinstance(frequency, int) or isinstance(frequency, bool) or frequency < 1:
        raise ValueError(f"config.json: moe_layer_freq must be a positive integer, got {frequency!r}")
    if frequency != 1:
        # transformers' DeepSeek models ignore the key (every layer from first_k_dense_replace on is sparse).
        raise ValueError(f"config.json: moe_layer_freq={frequency} is not supported (transformers' DeepSeek "
                         "models make every layer after the first first_k_dense_replace sparse)")
    num_shared = raw.get("n_shared_experts", defaults["n_shared_experts"]) or 0
    expert_width = _positive_int(raw, "moe_intermediate_size", defaults)
    routing = DeepseekRouting(
        scoring="softmax" if model_type == "deepseek_v2" else "sigmoid", num_groups=num_groups,
        top_k_groups=top_k_groups, group_score="top2_sum" if method == "noaux_tc" else "max",
        score_correction_bias=method == "noaux_tc",
        routed_scaling_factor=float(_value(raw, "routed_scaling_factor", defaults)))
    return dict(num_experts=num_experts, num_experts_per_token=top_k, expert_intermediate_size=expert_width,
                normalize_top_k=bool(_value(raw, "norm_topk_prob", defaults)) and model_type != "deepseek_v2",
                routing_weights_in_float32=True, shared_expert_intermediate_size=int(num_shared) * expert_width,
                dense_layers=tuple(range(min(int(first_dense), num_layers))), deepseek_routing=routing)
