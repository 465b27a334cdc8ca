"""The model configuration our Llama-family models need, parsed from a Hugging Face ``config.json``.

We read the JSON ourselves instead of going through ``transformers.AutoConfig`` so that the model code
depends on a small, explicit set of fields, and so that both spellings of RoPE settings in the wild
are accepted: ``rope_theta`` + ``rope_scaling`` (transformers 4.x checkpoints, e.g. Llama 3) and
``rope_parameters`` (transformers 5). Defaults follow each architecture's transformers config class.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.models.architecture_defaults import ARCHITECTURE_DEFAULTS
from engine.models.block_fp8 import parse_block_fp8
from engine.models.compressed_tensors import CompressedTensorsConfig, parse_compressed_tensors
from engine.models.deepseek_config import (DEEPSEEK_MODEL_TYPES, DeepseekRouting, MLAConfig, parse_deepseek_moe,
                                           parse_mla)
from engine.models.gemma_config import check_gemma, gemma3_rope, gemma_layer_windows
from engine.models.olmo3_config import olmo3_layer_windows, olmo3_rope
from engine.models.granite_config import granite_multipliers
from engine.models.layer_types import checked_layer_types, windows_of
from engine.models.llama4_config import llama4_moe, llama4_uses_rope
from engine.models.multimodal_text import flatten as flatten_multimodal
from engine.models.rope_config import ntk_alpha_rope, parse_rope, partial_rotary_factor
from engine.models.nope_layers import cohere2_layers, exaone4_layers, smollm3_layers
from engine.models.gpt_oss_config import GPT_OSS_DEFAULT_ROPE, gpt_oss_layer_windows, gpt_oss_moe


_DTYPE_NAMES = {"float32", "float16", "bfloat16"}


@dataclass(frozen=True)
class MoEConfig:
    """The sparse MLP of a mixture-of-experts checkpoint (Mixtral, Qwen2-MoE, Qwen3-MoE; DeepSeek's router and
    gpt-oss's experts differ as ``deepseek_routing`` and gpt_oss.py say).

    Every token's hidden state goes to ``num_experts_per_token`` of ``num_experts`` SwiGLU experts, chosen by
    a router (a [num_experts, hidden] projection, softmax in float32, top-k); their outputs are summed with
    the top-k probabilities as weights, renormalized to sum to 1 when ``normalize_top_k`` (Mixtral always,
    Qwen2-MoE when ``norm_topk_prob``). Qwen2-MoE adds a shared expert every token passes through, scaled
    by sigmoid(shared_expert_gate(x)).
    """
    num_experts: int
    num_experts_per_token: int
    expert_intermediate_size: int
    normalize_top_k: bool
    # Mixtral multiplies an expert's output by its float32 routing weight; Qwen2-MoE casts the weights to
    # the model dtype first. Equal in float32; in half precision each rounds its own way.
    routing_weights_in_float32: bool
    shared_expert_intermediate_size: int = 0  # 0: no shared expert
    dense_layers: tuple[int, ...] = ()  # layers whose MLP is dense (the Qwen mixtures' mlp_only_layers, sparse step)
    # DeepSeek's router (sigmoid or softmax scores, expert groups, a scaling factor) and ungated shared experts;
    # None: the softmax router above.
    deepseek_routing: DeepseekRouting | None = None


@dataclass
class ModelConfig:
    architecture: str  # the checkpoint's architectures[0], e.g. "LlamaForCausalLM"
    model_type: str  # "llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3_text", or a mixture of experts
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None  # normalized: has "rope_type"; None for plain RoPE
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # bias on q/k/v projections (Qwen2: True)
    mlp_bias: bool
    hidden_act: str
    sliding_window: int | None  # the window of the sliding-window layers; None when no layer slides
    bos_token_id: int | None
    eos_token_id: int | list[int] | None
    torch_dtype: str | None
    moe: MoEConfig | None = None  # the routed experts of a mixture-of-experts model; None for a dense one
    raw: dict[str, Any] = field(repr=False, default_factory=dict)
    # The RoPE base of the sliding-window layers when it differs from rope_theta's (Gemma 3's
    # rope_local_base_freq; rope_theta and rope_scaling are then the global layers'); None: one RoPE for all.
    local_rope_theta: float | None = None
    # Each layer's attention window (None: the full context), as transformers' model of this type reads the
    # config: every layer of a Mistral or Mixtral with a sliding_window; Qwen2's and Qwen3's layer_types.
    layer_sliding_windows: tuple[int | None, ...] = ()
    # Multi-head latent attention (DeepSeek-V2/V3, deepseek_config.py); None: every head caches its keys and
    # values. With MLA, num_key_value_heads is 1 and head_dim the cached latent's width (the cache's shape).
    mla: MLAConfig | None = None
    # Block-scaled FP8 weights (bn, bk), dequantized at load (block_fp8.py); None: weights stored as they run.
    weight_block_fp8: tuple[int, int] | None = None
    # The weight schemes of a compressed-tensors checkpoint, dequantized at load (compressed_tensors.py).
    compressed_tensors: CompressedTensorsConfig | None = None
    # The share of each head's features that RoPE turns (Phi-4-mini: 0.75); the rest carry no position.
    partial_rotary_factor: float = 1.0
    # Whether each layer applies RoPE (Cohere2's full layers and SmolLM3's every fourth have none); () : all do.
    layer_uses_rope: tuple[bool, ...] = ()

    def __post_init__(self) -> None:
        if not self.layer_sliding_windows:
            self.layer_sliding_windows = (self.sliding_window,) * self.num_hidden_layers
        if not self.layer_uses_rope:
            self.layer_uses_rope = (True,) * self.num_hidden_layers

    @property
    def max_model_len_limit(self) -> int:
        """The longest sequence the checkpoint's positions allow (sliding windows are attended as windows)."""
        return self.max_position_embeddings

    @property
    def attention_chunk(self) -> tuple[int | None, float]:
        """(chunk size, share of the layers) of chunked local attention (Llama 4's layers with RoPE); (None, 1.0)
        without it. For the step trace's pricing (CacheConfig.attention_chunk_size) and ``layer_kv_spans``."""
        chunk = self.raw.get("attention_chunk_size", 8192) if self.model_type == "llama4_text" else None
        chunked = sum(self.layer_uses_rope)
        if not chunk or not chunked:
            return None, 1.0
        return chunk, chunked / self.num_hidden_layers

    @property
    def layer_kv_spans(self) -> tuple[int | None, ...]:
        """How far back each layer reads the KV cache, which the hybrid KV cache groups layers by: its window, its
        chunk (Llama 4's chunked layers), None for every key."""
        chunk, _ = self.attention_chunk
        if chunk is None:
            return self.layer_sliding_windows
        return tuple(chunk if uses_rope else None for uses_rope in self.layer_uses_rope)

    @property
    def sliding_window_fraction(self) -> float:
        """The share of layers that attend ``sliding_window`` (1.0 when none slides: nothing to share). At 1 with a
        window no layer reads the keys before it, and the core hands back the blocks that leave it
        (CacheConfig.frees_out_of_window_blocks)."""
        if self.sliding_window is None:
            return 1.0
        return sum(window == self.sliding_window for window in self.layer_sliding_windows) / len(self.layer_sliding_windows)

    @property
    def rotary_dim(self) -> int:
        """Features of each head that RoPE turns: the first ``partial_rotary_factor`` of ``head_dim``."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def value_head_dim(self) -> int:
        """Features a cached value head holds: ``head_dim``, or 0 under MLA, whose values are read from the cached
        latent (the key) and have no tensor of their own."""
        return 0 if self.mla is not None else self.head_dim

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_pretrained(cls, path: str | Path) -> "ModelConfig":
        config_path = Path(path) / "config.json"
        if not config_path.is_file():
            raise FileNotFoundError(f"no config.json in model folder {str(path)!r}")
        return cls.from_dict(json.loads(config_path.read_text()))

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "ModelConfig":
        raw = flatten_multimodal(raw)  # a multimodal checkpoint is served as its language model
        architectures = raw.get("architectures") or []
        if not architectures:
            raise ValueError("config.json has no 'architectures' entry; cannot tell which model class to build")
        model_type = raw.get("model_type", "llama")
        if model_type not in ARCHITECTURE_DEFAULTS:
            # Before the field checks: a GPT-2 config lacks Llama's fields, and "missing 'hidden_size'"
            # would hide that the architecture itself is the problem.
            raise ValueError(f"unsupported model architecture {architectures[0]!r} (config.json model_type "
                             f"{model_type!r}); supported model types: {', '.join(ARCHITECTURE_DEFAULTS)}")
        defaults = ARCHITECTURE_DEFAULTS[model_type]

        def get(name: str, default: Any = None) -> Any:
            value = raw.get(name)
            return defaults.get(name, default) if value is None else value

        for required in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                         "num_attention_heads"):
            if raw.get(required) is None:
                raise ValueError(f"config.json is missing required field {required!r}")
        quantization = raw.get("quantization_config")
        if model_type == "gpt_oss" and isinstance(quantization, dict) and quantization.get("quant_method") == "mxfp4":
            quantization = None  # gpt-oss's MXFP4 experts are dequantized at load (gpt_oss.py, mxfp4.py)
        weight_block_fp8 = parse_block_fp8(quantization) if isinstance(quantization, dict) else None
        compressed = parse_compressed_tensors(quantization) if isinstance(quantization, dict) else None
        if weight_block_fp8 is not None or compressed is not None:
            quantization = None  # dequantized at load (block_fp8.py, compressed_tensors.py)
        if quantization:
            # Other quantized weights (per-tensor fp8, GPTQ, AWQ, ...) read as plain floats give a different
            # model; the loader must not run one silently.
            method = quantization.get("quant_method") if isinstance(quantization, dict) else quantization
            raise ValueError(f"config.json: quantization_config (quant_method {method!r}) is not supported; this "
                             "engine runs float32, float16 and bfloat16 checkpoints, and dequantizes block-scaled "
                             "FP8 ones (quant_method fp8 with weight_block_size), compressed-tensors ones (int 2/4/8-bit "
                             "and FP8 weights) and gpt-oss's MXFP4 experts")
        num_heads = int(raw["num_attention_heads"])
        num_kv_heads = raw["num_key_value_heads"] if "num_key_value_heads" in raw else defaults["num_key_value_heads"]
        num_kv_heads = num_heads if num_kv_heads is None else int(num_kv_heads)
        if num_heads % num_kv_heads != 0:
            raise ValueError(f"config.json: num_attention_heads={num_heads} is not a multiple of "
                             f"num_key_value_heads={num_kv_heads}")
        head_dim = int(get("head_dim", raw["hidden_size"] // num_heads))
        if model_type in ("gemma2", "gemma3_text"):
            check_gemma(raw)
        if model_type == "granite":
            granite_multipliers(raw)  # refused here, by key, rather than when the model is built
        if model_type == "gemma3_text":
            # The global layers' RoPE here; the local layers' base is Gemma's own (gemma_config.py).
            rope_theta, rope_scaling, local_rope_theta = gemma3_rope(raw)
        elif model_type == "olmo3":  # the scaling is the full layers' only (olmo3_config.py)
            rope_theta, rope_scaling, local_rope_theta = olmo3_rope(raw)
        else:
            if model_type == "gpt_oss" and not raw.get("rope_scaling") and not raw.get("rope_parameters"):
                raw = {**raw, "rope_scaling": dict(GPT_OSS_DEFAULT_ROPE)}  # transformers' default: YaRN
            rope_theta, rope_scaling = parse_rope(raw, defaults["rope_theta"])
            if model_type == "hunyuan_v1_dense":
                rope_theta, rope_scaling = ntk_alpha_rope(rope_theta, rope_scaling, head_dim)
            local_rope_theta = None
        if rope_scaling is not None and rope_scaling.get("original_max_position_embeddings", 0) is None:
            # No max_position_embeddings key: transformers' default for the model type is the original context.
            rope_scaling["original_max_position_embeddings"] = int(get("max_position_embeddings"))
        num_layers = int(raw["num_hidden_layers"])
        sliding_window = raw["sliding_window"] if "sliding_window" in raw else defaults["sliding_window"]
        if sliding_window is not None and (not isinstance(sliding_window, int) or isinstance(sliding_window, bool)
                                           or sliding_window < 1):
            raise ValueError(f"config.json: sliding_window must be a positive integer or null, got {sliding_window!r}")
        if model_type in ("mistral", "mixtral", "phi3", "starcoder2"):
            layer_windows = (sliding_window,) * num_layers  # transformers applies the window to every layer
        elif model_type in ("qwen2", "qwen3"):
            layer_windows = _qwen2_layer_windows(raw, sliding_window, num_layers)
        elif model_type in ("gemma2", "gemma3_text"):
            layer_windows = gemma_layer_windows(raw, model_type, sliding_window, num_layers)
        elif model_type == "gpt_oss":
            layer_windows = gpt_oss_layer_windows(raw, sliding_window, num_layers)
        elif model_type == "olmo3":
            layer_windows = olmo3_layer_windows(raw, num_layers)
        elif model_type in ("cohere2", "smollm3", "exaone4"):
            layer_windows, layer_uses_rope = {"cohere2": cohere2_layers, "smollm3": smollm3_layers,
                                              "exaone4": exaone4_layers}[model_type](
                raw, sliding_window, num_layers)
        elif model_type == "llama4_text":
            # Chunks are no windows: llama4.py attends within them, and layer_kv_spans groups their KV.
            layer_windows, layer_uses_rope = (None,) * num_layers, llama4_uses_rope(raw, num_layers)
        else:
            # Llama ignores the key; the Qwen mixtures store a window they do not use (_parse_moe refuses one
            # whose layers slide).
            layer_windows = (None,) * num_layers
        if model_type not in ("cohere2", "smollm3", "exaone4", "llama4_text"):
            layer_uses_rope = (True,) * num_layers
        sliding_window = next((window for window in layer_windows if window is not None), None)
        dtype = raw.get("torch_dtype", raw.get("dtype"))
        moe = _parse_moe(raw, model_type, int(raw["num_hidden_layers"]))
        mla = parse_mla(raw, model_type, rope_scaling) if model_type in DEEPSEEK_MODEL_TYPES else None
        if mla is not None:  # the cache's view: one latent "head" (module docstring of deepseek_config.py)
            num_kv_heads, head_dim = 1, mla.cache_width
        return cls(
            architecture=architectures[0],
            model_type=model_type,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=int(raw["hidden_size"]),
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(get("rms_norm_eps")),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=int(get("max_position_embeddings")),
            tie_word_embeddings=bool(get("tie_word_embeddings")),
            # transformers' Mistral and Mixtral have no biases at all and ignore these keys; so does this one.
            # Qwen2-MoE spells its q/k/v bias "qkv_bias" (transformers 5; absent before: true).
            attention_bias=(bool(raw.get("qkv_bias", True)) if model_type == "qwen2_moe"
                            else bool(get("attention_bias")) and model_type not in ("mistral", "mixtral")),
            # Only these architectures read mlp_bias.
            mlp_bias=bool(get("mlp_bias")) and model_type in ("llama", "granite", "smollm3", "seed_oss"),
            # Gemma names its activation hidden_activation (gelu_pytorch_tanh).
            hidden_act=str(raw.get("hidden_activation", "gelu_pytorch_tanh") if model_type in ("gemma2", "gemma3_text")
                           else raw.get("hidden_act", "silu")),
            sliding_window=sliding_window,
            layer_sliding_windows=layer_windows,
            local_rope_theta=local_rope_theta,
            bos_token_id=raw.get("bos_token_id"),
            eos_token_id=raw.get("eos_token_id"),
            torch_dtype=dtype if dtype in _DTYPE_NAMES else None,
            moe=moe,
            raw=raw,
            mla=mla,
            weight_block_fp8=weight_block_fp8,
            compressed_tensors=compressed,
            # GLM-4 and GLM-4.5 turn half of each head unless the config says otherwise (transformers' default).
            partial_rotary_factor=partial_rotary_factor(raw, head_dim,
                                                        0.5 if model_type in ("glm4_moe", "glm", "glm4") else 1.0),
            layer_uses_rope=layer_uses_rope,
        )


def _parse_moe(raw: dict[str, Any], model_type: str, num_layers: int) -> MoEConfig | None:
    """The experts of a Mixtral, Qwen2-MoE or Qwen3-MoE config (transformers' defaults for absent keys); None
    for a dense model type. A Qwen-MoE sliding window is refused here: its rule differs from Qwen2's."""
    if model_type == "mixtral":
        num_experts = _positive(raw, "num_local_experts", 8)
        return MoEConfig(num_experts=num_experts,
                         num_experts_per_token=_top_k(raw, num_experts, 2),
                         expert_intermediate_size=_positive(raw, "intermediate_size", None),
                         normalize_top_k=True, routing_weights_in_float32=True)
    if model_type in (*DEEPSEEK_MODEL_TYPES, "glm4_moe"):
        return MoEConfig(**parse_deepseek_moe(raw, model_type, num_layers))
    if model_type == "gpt_oss":
        num_experts = _positive(raw, "num_local_experts", 128)
        return MoEConfig(**gpt_oss_moe(raw, num_experts, _top_k(raw, num_experts, 4)))
    if model_type == "llama4_text":
        return MoEConfig(**llama4_moe(raw, num_layers))
    if model_type not in ("qwen2_moe", "qwen3_moe"):
        return None
    name = {"qwen2_moe": "Qwen2-MoE", "qwen3_moe": "Qwen3-MoE"}[model_type]
    layer_types = raw.get("layer_types") or []
    if raw.get("use_sliding_window") or "sliding_attention" in layer_types:
        raise ValueError(f"config.json: {name} with use_sliding_window=true (or sliding_attention layers) is not "
                         "supported; sliding-window attention is not implemented")
    qwen3 = model_type == "qwen3_moe"
    # transformers' Qwen3MoeConfig maps num_experts onto num_local_experts, and save_pretrained writes only the
    # latter (the Hub's checkpoints, older, have num_experts); with both, num_local_experts wins, as there.
    experts_key = "num_local_experts" if qwen3 and raw.get("num_local_experts") is not None else "num_experts"
    num_experts = _positive(raw, experts_key, 128 if qwen3 else 60)
    step = _positive(raw, "decoder_sparse_step", 1)
    mlp_only = raw.get("mlp_only_layers") or []
    if not isinstance(mlp_only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in mlp_only):
        raise ValueError(f"config.json: mlp_only_layers must be a list of layer indices, got {mlp_only!r}")
    # transformers' rule: a layer is sparse unless listed, and only every decoder_sparse_step-th one.
    dense = tuple(i for i in range(num_layers) if i in mlp_only or (i + 1) % step != 0)
    return MoEConfig(num_experts=num_experts,
                     num_experts_per_token=_top_k(raw, num_experts, 8 if qwen3 else 4),
                     expert_intermediate_size=_positive(raw, "moe_intermediate_size", 768 if qwen3 else 1408),
                     normalize_top_k=bool(raw.get("norm_topk_prob", False)),
                     routing_weights_in_float32=False,
                     # Qwen3-MoE has no shared expert (its checkpoints carry no such key either).
                     shared_expert_intermediate_size=0 if qwen3 else int(
                         raw.get("shared_expert_intermediate_size", 5632) or 0),
                     dense_layers=dense)


def _positive(raw: dict[str, Any], key: str, default: int | None) -> int:
    value = raw.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"config.json: {key} must be a positive integer, got {value!r}")
    return value


def _top_k(raw: dict[str, Any], num_experts: int, default: int) -> int:
    top_k = _positive(raw, "num_experts_per_tok", default)
    if top_k > num_experts:
        raise ValueError(f"config.json: num_experts_per_tok={top_k} exceeds the {num_experts} experts")
    return top_k


def _qwen2_layer_windows(raw: dict[str, Any], sliding_window: int | None, num_layers: int) -> tuple[int | None, ...]:
    """Each Qwen2 or Qwen3 layer's window, as transformers decides: the window is used only with
    ``use_sliding_window``; which layers slide comes from ``layer_types`` when the config lists them, else
    the layers from ``max_window_layers`` (default 28) on, so a model with no more layers than that attends
    over the full context in every layer."""
    window = sliding_window if raw.get("use_sliding_window", False) else None
    if raw.get("layer_types"):
        # transformers drops the window without use_sliding_window, and its sliding layers then have none to apply:
        # refuse rather than guess which model was meant.
        return windows_of(checked_layer_types(raw, num_layers), window,
                          "layer_types has sliding_attention layers but use_sliding_window is not true "
                          f"(sliding_window={sliding_window!r}); set use_sliding_window and sliding_window")
    max_window_layers = raw.get("max_window_layers")
    max_window_layers = 28 if max_window_layers is None else int(max_window_layers)
    return tuple(window if index >= max_window_layers else None for index in range(num_layers))
