"""Reading a model's shape from its Hugging Face ``config.json``, for the architectures ``ModelShape`` models
one to one; any other is refused by name rather than priced as something it is not. A vision-language model's
config (Gemma 3, LLaVA, Qwen2-VL, Mistral 3, Qwen3-VL) gives its language model's shape (sim/hf_vision_config.py reads the rest)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sim.hf_checkpoint_quantization import stored_quantization
from sim.deepseek_config import deepseek_shape
from sim.hf_config_file import read_config_json
from sim.hf_vision_config import VISION_LANGUAGE_ARCHITECTURES, language_model_config
from sim.llama4_config import LLAMA4_ARCHITECTURES, llama4_shape, llama4_text_config
from sim.model_shapes import ModelShape

# Architectures whose config.json maps onto ModelShape one to one (Phi-3, Granite, OLMo 2 and Cohere differ from
# Llama in norms, fused checkpoint tensors, scalar multipliers and Cohere's parallel blocks, not in matmuls; all: RMSNorm, RoPE, a gated MLP of three
# matmuls, SiLU or Gemma's tanh-GELU; the mixtures of experts: SwiGLU experts in every layer, a softmax router
# picking the top k).
DENSE_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                       "Gemma2ForCausalLM", "Gemma3ForCausalLM", "Phi3ForCausalLM", "GraniteForCausalLM",
                       "Olmo2ForCausalLM", "Olmo3ForCausalLM", "GlmForCausalLM", "Glm4ForCausalLM", "SeedOssForCausalLM",
                       "Exaone4ForCausalLM", "Ernie4_5ForCausalLM", "HunYuanDenseV1ForCausalLM",
                       "InternLM3ForCausalLM",
                       "CohereForCausalLM", "Cohere2ForCausalLM", "SmolLM3ForCausalLM",
                       "Starcoder2ForCausalLM")
MOE_ARCHITECTURES = ("MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "GptOssForCausalLM")
# DeepSeek-V2 and V3 (and what shares V3's architecture: DeepSeek-R1, Kimi K2): multi-head latent attention,
# dense MLPs in the first layers, experts with ungated shared experts in the rest (sim/deepseek_config.py); GLM-4.5
# the same mixture of experts with grouped-query attention.
DEEPSEEK_ARCHITECTURES = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "Glm4MoeForCausalLM")
SUPPORTED_ARCHITECTURES = DENSE_ARCHITECTURES + MOE_ARCHITECTURES + DEEPSEEK_ARCHITECTURES + LLAMA4_ARCHITECTURES
_MODEL_TYPE_TO_ARCHITECTURE = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                               "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                               "mixtral": "MixtralForCausalLM",
                               "qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
                               "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
                               "deepseek_v2": "DeepseekV2ForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM",
                               "gpt_oss": "GptOssForCausalLM", "glm4_moe": "Glm4MoeForCausalLM",
                               "phi3": "Phi3ForCausalLM", "granite": "GraniteForCausalLM", "olmo2": "Olmo2ForCausalLM",
                               "olmo3": "Olmo3ForCausalLM", "glm": "GlmForCausalLM", "glm4": "Glm4ForCausalLM",
                               "seed_oss": "SeedOssForCausalLM", "exaone4": "Exaone4ForCausalLM",
                               "ernie4_5": "Ernie4_5ForCausalLM", "hunyuan_v1_dense": "HunYuanDenseV1ForCausalLM",
                               "internlm3": "InternLM3ForCausalLM",
                               "cohere": "CohereForCausalLM", "cohere2": "Cohere2ForCausalLM",
                               "smollm3": "SmolLM3ForCausalLM", "starcoder2": "Starcoder2ForCausalLM",
                               "llama4_text": "Llama4ForCausalLM", "llama4": "Llama4ForConditionalGeneration"}
# What transformers assumes when a config leaves max_position_embeddings out.
_DEFAULT_MAX_POSITIONS = {"LlamaForCausalLM": 2048, "MistralForCausalLM": 4096 * 32, "Qwen2ForCausalLM": 32768,
                          "Qwen3ForCausalLM": 32768,
                          "MixtralForCausalLM": 4096 * 32, "Qwen2MoeForCausalLM": 32768,
                          "Qwen3MoeForCausalLM": 32768, "Gemma2ForCausalLM": 8192, "Gemma3ForCausalLM": 131072,
                          "GptOssForCausalLM": 131072, "Phi3ForCausalLM": 4096, "GraniteForCausalLM": 2048,
                          "Olmo2ForCausalLM": 2048, "Olmo3ForCausalLM": 2048, "GlmForCausalLM": 131072,
                          "Glm4ForCausalLM": 131072, "SeedOssForCausalLM": 524288,
                          "Exaone4ForCausalLM": 2048, "Ernie4_5ForCausalLM": 131072,
                          "HunYuanDenseV1ForCausalLM": 2048, "InternLM3ForCausalLM": 32768, "CohereForCausalLM": 8192, "Cohere2ForCausalLM": 8192,
                          "SmolLM3ForCausalLM": 32768, "Starcoder2ForCausalLM": 4096}
# Each MoE architecture's keys for (experts, experts per token, expert width, shared expert width), with the
# defaults transformers' config classes give a key left out (None: the key must be there).
_MOE_KEYS = {
    # Mixtral's experts are as wide as its intermediate_size; it has no shared expert.
    "MixtralForCausalLM": (("num_local_experts", 8), ("num_experts_per_tok", 2), ("intermediate_size", None), None),
    "Qwen2MoeForCausalLM": (("num_experts", 60), ("num_experts_per_tok", 4), ("moe_intermediate_size", 1408),
                            ("shared_expert_intermediate_size", 5632)),
    "Qwen3MoeForCausalLM": (("num_experts", 128), ("num_experts_per_tok", 8), ("moe_intermediate_size", 768), None),
    # gpt-oss: its experts are as wide as its intermediate_size (2,880, its hidden size too); no shared expert.
    "GptOssForCausalLM": (("num_local_experts", 128), ("num_experts_per_tok", 4), ("intermediate_size", 2880), None),
}


def model_from_hf_config(path: str | Path) -> ModelShape:
    """Read the shape from a Llama / Mistral / Qwen2 / Qwen3 / Gemma 2 / Gemma 3 ``config.json``, a Mixtral /
    Qwen2-MoE / Qwen3-MoE / DeepSeek-V2 / DeepSeek-V3 one, or a vision-language model's (its language model's
    shape)."""
    path = Path(path)
    config = read_config_json(path)
    # A vision-language config becomes its language model's, which the rest reads as a text config.
    config = language_model_config(config, path) or config
    architectures = config.get("architectures") or [_MODEL_TYPE_TO_ARCHITECTURE.get(config.get("model_type"), None)]
    architecture = next((a for a in architectures if a in SUPPORTED_ARCHITECTURES), None)
    if architecture is None:
        raise ValueError(f"model: {path}: architecture {architectures!r} (model_type {config.get('model_type')!r}) "
                         f"is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}; vision-language "
                         f"(the language model read): {', '.join(VISION_LANGUAGE_ARCHITECTURES)}")

    def key(name: str, default: object = None) -> int:
        # Some configs write null for a key they mean to leave at its default (head_dim, for one).
        raw = config.get(name)
        raw = default if raw is None else raw
        if raw is None:
            raise ValueError(f"model: {path}: config.json lacks the key {name!r}")
        if not isinstance(raw, int) or isinstance(raw, bool) or raw < 1:
            raise ValueError(f"model: {path}: key {name!r} must be a positive integer, got {raw!r}")
        return raw

    if architecture in DEEPSEEK_ARCHITECTURES:
        return deepseek_shape(config, architecture, path, key)
    if architecture in LLAMA4_ARCHITECTURES:
        config = llama4_text_config(config, path)  # what key() reads from here on
        return llama4_shape(config, path, key)

    hidden_size = key("hidden_size")
    num_heads = key("num_attention_heads")
    gemma = architecture in ("Gemma2ForCausalLM", "Gemma3ForCausalLM")
    starcoder = architecture == "Starcoder2ForCausalLM"  # a plain (not gated) tanh-GELU MLP, biases everywhere
    if starcoder:
        if config.get("hidden_act", "gelu_pytorch_tanh") not in ("gelu_pytorch_tanh", "gelu_tanh", "gelu"):
            raise ValueError(f"model: {path}: key 'hidden_act' is {config['hidden_act']!r}; StarCoder2's GELU MLP is "
                             "modelled")
    elif gemma:
        if config.get("hidden_activation", "gelu_pytorch_tanh") not in ("gelu_pytorch_tanh", "gelu_tanh"):
            raise ValueError(f"model: {path}: key 'hidden_activation' is {config['hidden_activation']!r}; Gemma 3's "
                             "tanh-GELU-gated MLP is modelled")  # Gemma 2's too
    elif config.get("hidden_act", "silu") not in ("silu", "swish"):
        raise ValueError(f"model: {path}: key 'hidden_act' is {config['hidden_act']!r}; "
                         f"only a SiLU-gated MLP is modelled")
    experts = _experts(config, architecture, path, key)
    if architecture == "Qwen2MoeForCausalLM":
        qkv_bias = bool(config.get("qkv_bias", True))  # transformers' Qwen2MoeConfig: a key, true by default
    elif architecture in ("GptOssForCausalLM", "GlmForCausalLM", "Glm4ForCausalLM", "SeedOssForCausalLM"):
        qkv_bias = bool(config.get("attention_bias", True))  # these architectures' attention has biases by default
    elif starcoder:
        qkv_bias = bool(config.get("use_bias", True))
    elif architecture == "Ernie4_5ForCausalLM":
        qkv_bias = bool(config.get("use_bias", False))
    elif architecture == "InternLM3ForCausalLM":
        qkv_bias = bool(config.get("qkv_bias", config.get("attention_bias", False)))
    else:
        qkv_bias = architecture == "Qwen2ForCausalLM" or bool(config.get("attention_bias", False))
    return ModelShape(
        name=str(config.get("_name_or_path") or path.parent.name or path.stem),
        num_layers=key("num_hidden_layers"),
        hidden_size=hidden_size,
        num_attention_heads=num_heads,
        num_kv_heads=key("num_key_value_heads", num_heads),
        # Qwen3's and Gemma 3's config classes have head_dim as a key of their own (128, 256 when left out); the
        # others divide.
        head_dim=key("head_dim", {"Qwen3ForCausalLM": 128, "Gemma2ForCausalLM": 256, "Gemma3ForCausalLM": 256,
                                  "GptOssForCausalLM": 64}.get(architecture,
                                                                                          hidden_size // num_heads)),
        # An MoE config's dense width (Qwen's 6144 or 5632) prices nothing, but is kept as the config gives it
        # (left out: the experts' width).
        intermediate_size=key("intermediate_size", experts.get("moe_intermediate_size")),
        vocab_size=key("vocab_size"),
        max_position_embeddings=key("max_position_embeddings", _DEFAULT_MAX_POSITIONS[architecture]),
        gated_mlp=not starcoder,
        # Gemma and Cohere tie by default.
        tied_embeddings=bool(config.get("tie_word_embeddings", gemma or architecture in (
            "CohereForCausalLM", "Cohere2ForCausalLM", "SmolLM3ForCausalLM", "Starcoder2ForCausalLM",
            "Ernie4_5ForCausalLM"))),
        qkv_bias=qkv_bias,
        stored_quantization=stored_quantization(config, path),
        **_sliding_layers(config, architecture, path),
        **experts,
    )


def _sliding_layers(config: dict, architecture: str, path: Path) -> dict:
    """``sliding_window`` and ``num_sliding_layers`` as transformers reads the config (engine/models/config.py and
    gemma_config.py are the engine's reading; this module must not import torch, so it reads the few keys
    again): Mistral's window on every layer, Qwen2/Qwen3's from ``max_window_layers`` on with
    ``use_sliding_window``, Gemma 3's five local layers of every six; ``layer_types`` wins where given."""
    num_layers = config["num_hidden_layers"]
    if architecture in ("MistralForCausalLM", "MixtralForCausalLM", "Phi3ForCausalLM", "Starcoder2ForCausalLM"):
        default = 4096 if architecture == "MistralForCausalLM" else None
        window = _positive_window(config["sliding_window"] if "sliding_window" in config else default, path)
        return {"sliding_window": window}
    if architecture in ("Gemma2ForCausalLM", "Gemma3ForCausalLM"):
        window = _positive_window(config.get("sliding_window", 4096), path)
        # Gemma 2 alternates local and global layers; Gemma 3 has five local ones to a global one.
        pattern = 2 if architecture == "Gemma2ForCausalLM" else config.get("sliding_window_pattern") or 6
        default_types = ["sliding_attention" if (index + 1) % pattern else "full_attention" for index in range(num_layers)]
    elif architecture == "Olmo3ForCausalLM":
        # Three windowed layers to one full, as transformers' Olmo3Config derives them.
        window = _positive_window(config.get("sliding_window", 4096), path)
        default_types = ["sliding_attention" if (index + 1) % 4 else "full_attention" for index in range(num_layers)]
    elif architecture == "Exaone4ForCausalLM" and config.get("sliding_window", 4096) is not None:
        # As Cohere2 (engine/models/nope_layers.py); a pattern that is no number needs layer_types.
        window = _positive_window(config.get("sliding_window", 4096), path)
        pattern = config.get("sliding_window_pattern", 4)
        pattern = pattern if isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 0 else 4
        default_types = ["sliding_attention" if (index + 1) % pattern else "full_attention" for index in range(num_layers)]
    elif architecture == "Cohere2ForCausalLM":
        # Three windowed layers to one full (sliding_window_pattern), as transformers' Cohere2Config derives them.
        window = _positive_window(config.get("sliding_window", 4096), path)
        pattern = config.get("sliding_window_pattern") or 4
        default_types = ["sliding_attention" if (index + 1) % pattern else "full_attention" for index in range(num_layers)]
    elif architecture == "SmolLM3ForCausalLM" and config.get("use_sliding_window"):
        # The layers without RoPE (every fourth, or no_rope_layers' zeros) slide.
        window = _positive_window(config.get("sliding_window"), path)
        interval = config.get("no_rope_layer_interval") or 4
        uses_rope = config.get("no_rope_layers") or [int((index + 1) % interval != 0) for index in range(num_layers)]
        default_types = ["full_attention" if rope else "sliding_attention" for rope in uses_rope]
    elif architecture == "GptOssForCausalLM":
        # gpt-oss alternates 128-token windows and full attention, the first layer windowed.
        window = _positive_window(config.get("sliding_window", 128), path)
        default_types = ["sliding_attention" if (index + 1) % 2 else "full_attention" for index in range(num_layers)]
    elif architecture in ("Qwen2ForCausalLM", "Qwen3ForCausalLM") and config.get("use_sliding_window"):
        window = _positive_window(config.get("sliding_window", 4096), path)
        first_sliding = config.get("max_window_layers")
        first_sliding = 28 if first_sliding is None else first_sliding  # transformers' default
        default_types = ["sliding_attention" if index >= first_sliding else "full_attention"
                         for index in range(num_layers)]
    else:
        return {}  # Llama ignores the key; Qwen uses its window only with use_sliding_window
    layer_types = config.get("layer_types") or default_types
    num_sliding = sum(kind == "sliding_attention" for kind in layer_types)
    if window is None or num_sliding == 0:
        return {}
    return {"sliding_window": window, "num_sliding_layers": None if num_sliding == len(layer_types) else num_sliding}


def _positive_window(window: object, path: Path) -> int | None:
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
        raise ValueError(f"model: {path}: key 'sliding_window' must be a positive integer or null, got {window!r}")
    return window


def _experts(config: dict, architecture: str, path: Path, key: Callable[..., int]) -> dict[str, int]:
    """The ModelShape fields of an MoE architecture's experts ({} for a dense one). Refuses, by key, a config
    where some layers keep a dense MLP: the shape prices every layer alike, so it would price another model."""
    if architecture not in _MOE_KEYS:
        return {}
    mlp_only_layers = config.get("mlp_only_layers") or []
    if mlp_only_layers:
        raise ValueError(f"model: {path}: key 'mlp_only_layers' is {mlp_only_layers!r}; layers with a dense MLP "
                         "among the experts' layers are not modelled (every layer is priced as a mixture of experts)")
    sparse_step = config.get("decoder_sparse_step", 1)
    if sparse_step != 1:
        raise ValueError(f"model: {path}: key 'decoder_sparse_step' is {sparse_step!r}; only 1 (experts in every "
                         "layer) is modelled")
    experts, per_token, width, shared = _MOE_KEYS[architecture]
    if architecture == "Qwen3MoeForCausalLM" and config.get("num_local_experts") is not None:
        # transformers 5 saves a Qwen3-MoE's num_experts as num_local_experts (its attribute_map), and reads
        # that key first when a config has both.
        experts = ("num_local_experts", None)
    fields = {"num_experts": key(*experts), "num_experts_per_token": key(*per_token),
              "moe_intermediate_size": key(*width)}
    if shared is not None:
        # 0 is a config's way to say "no shared expert"; key() takes positive integers only.
        raw = config.get(shared[0])
        fields["shared_expert_intermediate_size"] = 0 if raw == 0 else key(*shared)
    if fields["num_experts_per_token"] > fields["num_experts"]:
        raise ValueError(f"model: {path}: key {per_token[0]!r} is {fields['num_experts_per_token']}, more than the "
                         f"{fields['num_experts']} experts ({experts[0]!r})")
    return fields
