"""Named model shapes, and ``resolve_model``: what a workload's ``model:`` key turns into.

A workload names a model by preset (figures copied from the model's published Hugging Face
``config.json``), by a path to a ``config.json`` (or a folder holding one: ``sim/hf_model_config.py``), or
inline as a mapping of ``ModelShape`` fields.
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from pathlib import Path

from sim.hf_model_config import model_from_hf_config
from sim.model_shapes import ModelShape


def _shape(name: str, layers: int, hidden: int, heads: int, kv_heads: int, intermediate: int, vocab: int,
           max_positions: int, *, head_dim: int | None = None, tied: bool = False,
           qkv_bias: bool = False, experts: int = 0, experts_per_token: int = 0, expert_width: int = 0,
           shared_expert_width: int = 0, sliding_window: int | None = None,
           sliding_layers: int | None = None, stored: str | None = None) -> ModelShape:
    return ModelShape(name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                      num_kv_heads=kv_heads, head_dim=head_dim or hidden // heads, intermediate_size=intermediate,
                      vocab_size=vocab, max_position_embeddings=max_positions, gated_mlp=True,
                      tied_embeddings=tied, qkv_bias=qkv_bias, num_experts=experts,
                      num_experts_per_token=experts_per_token, moe_intermediate_size=expert_width,
                      shared_expert_intermediate_size=shared_expert_width, sliding_window=sliding_window,
                      num_sliding_layers=sliding_layers, stored_quantization=stored)


def _deepseek(name: str, layers: int, hidden: int, heads: int, intermediate: int, vocab: int, max_positions: int,
              *, experts: int, experts_per_token: int, expert_width: int, shared_experts: int, dense_layers: int,
              q_lora_rank: int, mtp_layers: int = 0, stored: str | None = None) -> ModelShape:
    """DeepSeek-V2/V3's layout: latent attention (kv_lora_rank 512, 128 + 64 query/key numbers per head, values of
    128), dense MLPs in the first layers, ungated shared experts as wide as the routed ones."""
    return ModelShape(name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                      num_kv_heads=heads, head_dim=128 + 64, intermediate_size=intermediate, vocab_size=vocab,
                      max_position_embeddings=max_positions, num_experts=experts,
                      num_experts_per_token=experts_per_token, moe_intermediate_size=expert_width,
                      shared_expert_intermediate_size=shared_experts * expert_width, shared_expert_gate=False,
                      num_dense_layers=dense_layers, kv_lora_rank=512, q_lora_rank=q_lora_rank,
                      qk_rope_head_dim=64, v_head_dim=128, num_mtp_layers=mtp_layers, stored_quantization=stored)


# Figures from each model's published config.json. Parameter counts these give (checked in tests):
# llama-2-7b 6.74B, llama-2-13b 13.0B, llama-2-70b 69.0B, llama-3-8b 8.03B, llama-3-70b 70.6B,
# mistral-7b 7.24B, mistral-7b-v0.3 7.25B, qwen2-7b 7.62B, qwen2-0.5b 0.494B, qwen3-8b 8.19B, qwen3-32b 32.8B, llama-3.2-1b 1.24B
# (Llama-3's tokenizer: a draft model for speculative decoding with the Llama-3 models), llava-1.5-7b 6.74B and
# qwen2-vl-7b 7.62B (language models only: the published 7.06B and 8.29B add the vision encoders,
# sim/vision_encoders.py). Qwen3's per-head q and k norms (2 x 128 weights a layer) are not counted: 0.0001% of
# the model.
MODEL_PRESETS: dict[str, ModelShape] = {shape.name: shape for shape in (
    _shape("llama-2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
    _shape("llama-2-13b", 40, 5120, 40, 40, 13824, 32000, 4096),
    _shape("llama-2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
    _shape("llama-3-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
    _shape("llama-3-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
    _shape("llama-3.1-8b", 32, 4096, 32, 8, 14336, 128256, 131072),
    _shape("llama-3.2-1b", 16, 2048, 32, 8, 8192, 128256, 131072, tied=True),
    _shape("mistral-7b", 32, 4096, 32, 8, 14336, 32000, 32768, sliding_window=4096),  # v0.1: a 4096-token window
    _shape("mistral-7b-v0.3", 32, 4096, 32, 8, 14336, 32768, 32768),  # v0.2 on: full attention, a larger vocabulary
    _shape("qwen2-7b", 28, 3584, 28, 4, 18944, 152064, 131072, qkv_bias=True),
    _shape("qwen2-0.5b", 24, 896, 14, 2, 4864, 151936, 131072, tied=True, qkv_bias=True),
    _shape("qwen3-8b", 36, 4096, 32, 8, 12288, 151936, 40960, head_dim=128),
    # Gemma 2: local (4,096-token window) and global layers alternate; Gemma 3's text models: five local layers
    # to one global. Every KV block stays, the windows only save attention work. Tied embeddings of a 256k / 262k
    # vocabulary. (Gemma 2's tanh caps on scores and logits cost nothing the roofline sees.)
    _shape("gemma-2-2b", 26, 2304, 8, 4, 9216, 256000, 8192, head_dim=256, tied=True, sliding_window=4096,
           sliding_layers=13),
    _shape("gemma-2-9b", 42, 3584, 16, 8, 14336, 256000, 8192, head_dim=256, tied=True, sliding_window=4096,
           sliding_layers=21),
    _shape("gemma-2-27b", 46, 4608, 32, 16, 36864, 256000, 8192, head_dim=128, tied=True, sliding_window=4096,
           sliding_layers=23),
    _shape("gemma-3-1b", 26, 1152, 4, 1, 6912, 262144, 32768, head_dim=256, tied=True, sliding_window=512,
           sliding_layers=22),
    _shape("gemma-3-4b", 34, 2560, 8, 4, 10240, 262208, 131072, head_dim=256, tied=True, sliding_window=1024,
           sliding_layers=29),
    _shape("gemma-3-12b", 48, 3840, 16, 8, 15360, 262208, 131072, head_dim=256, tied=True, sliding_window=1024,
           sliding_layers=40),
    _shape("gemma-3-27b", 62, 5376, 32, 16, 21504, 262208, 131072, head_dim=128, tied=True, sliding_window=1024,
           sliding_layers=52),
    _shape("qwen3-32b", 64, 5120, 64, 8, 25600, 151936, 40960, head_dim=128),
    # More dense families the engine runs (tests/sim/test_presets.py checks the counts): Phi-4 14.7B, Phi-4-mini
    # 3.84B (RoPE on 3/4 of each head and LongRoPE cost what RoPE does), Phi-3.5-mini 3.82B, Granite-3.1-8B 8.17B,
    # OLMo-2-1124-7B 7.30B, OLMo 3 7.30B and 32.2B, Command-R (c4ai-command-r-v01, no grouped-query attention) 35.0B, SmolLM3-3B 3.08B.
    _shape("phi-4", 40, 5120, 40, 10, 17920, 100352, 16384),
    _shape("phi-4-mini", 32, 3072, 24, 8, 8192, 200064, 131072, tied=True),
    _shape("phi-3.5-mini", 32, 3072, 32, 32, 8192, 32064, 131072),
    _shape("granite-3.1-8b", 40, 4096, 32, 8, 12800, 49155, 131072, tied=True),
    _shape("olmo-2-7b", 32, 4096, 32, 32, 11008, 100352, 4096),
    # OLMo 3 (7B and 32B): OLMo 2's layers with three in four in a 4,096-token window, the fourth full; YaRN to 65,536
    # tokens on the full layers. On vLLM's hybrid KV cache (sim/kv_cache_groups.py).
    _shape("olmo-3-7b", 32, 4096, 32, 32, 11008, 100278, 65536, sliding_window=4096, sliding_layers=24),
    _shape("olmo-3-32b", 64, 5120, 40, 8, 27648, 100278, 65536, sliding_window=4096, sliding_layers=48),
    _shape("command-r", 40, 8192, 64, 64, 22528, 256000, 8192, tied=True),
    _shape("smollm3-3b", 36, 2048, 16, 4, 11008, 128256, 65536, tied=True),
    # Multimodal models' language models (text_config); their vision encoders are in sim/vision_encoders.py.
    # LLaVA-1.5-7B: Llama-2-7B with 64 more vocabulary rows (<image>, <pad>, padding to 64); Qwen2-VL-7B: Qwen2-7B
    # with a 32k context (its M-RoPE positions cost what RoPE does).
    _shape("llava-1.5-7b", 32, 4096, 32, 32, 11008, 32064, 4096),
    _shape("qwen2-vl-7b", 28, 3584, 28, 4, 18944, 152064, 32768, qkv_bias=True),
    # Qwen3-VL-8B: Qwen3-8B with a 256k context (interleaved M-RoPE costs what RoPE does).
    _shape("qwen3-vl-8b", 36, 4096, 32, 8, 12288, 151936, 262144, head_dim=128),
    # Mixtures of experts (tests/sim/test_moe_shapes.py checks the counts). Total and active (per token)
    # parameters: mixtral-8x7b 46.7B / 12.9B, mixtral-8x22b 141B / 39.2B, qwen3-30b-a3b 30.5B / 3.35B,
    # qwen1.5-moe-a2.7b 14.3B / 2.69B, qwen3-235b-a22b 235.1B / 22.2B. Mixtral's experts are as wide as its
    # config's intermediate_size;
    # Qwen's intermediate_size is the config's dense width, which no layer of these models uses.
    _shape("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, 32768, experts=8, experts_per_token=2,
           expert_width=14336),
    _shape("mixtral-8x22b", 56, 6144, 48, 8, 16384, 32768, 65536, experts=8, experts_per_token=2,
           expert_width=16384),
    _shape("qwen3-30b-a3b", 48, 2048, 32, 4, 6144, 151936, 40960, head_dim=128, experts=128,
           experts_per_token=8, expert_width=768),
    _shape("qwen1.5-moe-a2.7b", 24, 2048, 16, 16, 5632, 151936, 8192, qkv_bias=True, experts=60,
           experts_per_token=4, expert_width=1408, shared_expert_width=5632),
    _shape("qwen3-235b-a22b", 94, 4096, 64, 4, 12288, 151936, 40960, head_dim=128, experts=128,
           experts_per_token=8, expert_width=1536),
    # Zhipu's GLM-4.5 and GLM-4.5-Air: DeepSeek's layout of experts (dense first layers, one ungated shared expert;
    # sim/deepseek_config.py reads their config.json) with grouped-query attention and biases on q, k and v.
    # Total / active with the embedding: glm-4.5 352.8B / 33.6B, glm-4.5-air 106.9B / 13.4B (the published 355B /
    # 32B and 106B / 12B). One multi-token-prediction layer each (method mtp).
    ModelShape(name="glm-4.5", num_layers=92, hidden_size=5120, num_attention_heads=96, num_kv_heads=8, head_dim=128,
               intermediate_size=12288, vocab_size=151552, max_position_embeddings=131072, qkv_bias=True,
               num_experts=160, num_experts_per_token=8, moe_intermediate_size=1536,
               shared_expert_intermediate_size=1536, shared_expert_gate=False, num_dense_layers=3, num_mtp_layers=1),
    ModelShape(name="glm-4.5-air", num_layers=46, hidden_size=4096, num_attention_heads=96, num_kv_heads=8,
               head_dim=128, intermediate_size=10944, vocab_size=151552, max_position_embeddings=131072,
               qkv_bias=True, num_experts=128, num_experts_per_token=8, moe_intermediate_size=1408,
               shared_expert_intermediate_size=1408, shared_expert_gate=False, num_dense_layers=1, num_mtp_layers=1),
    # Meta's Llama 4 (sim/llama4_config.py reads their config.json; tests/sim/test_llama4_shapes.py checks the counts):
    # Scout 16 experts in every layer, Maverick 128 in every other layer (dense MLPs of 16,384 between), top-1 and an
    # ungated shared expert of 8,192, grouped-query attention. Total / active with the embedding: llama-4-scout
    # 107.8B / 17.2B, llama-4-maverick 400.7B / 17.2B (the published 109B and 400B count the vision tower too).
    # Three layers in four attend within chunks of 8,192 tokens (attention_chunk_size; the fourth the whole context).
    ModelShape(name="llama-4-scout", num_layers=48, hidden_size=5120, num_attention_heads=40, num_kv_heads=8,
               head_dim=128, intermediate_size=16384, vocab_size=202048, max_position_embeddings=10485760,
               num_experts=16, num_experts_per_token=1, moe_intermediate_size=8192,
               shared_expert_intermediate_size=8192, shared_expert_gate=False, attention_chunk_size=8192,
               num_chunked_layers=36),
    ModelShape(name="llama-4-maverick", num_layers=48, hidden_size=5120, num_attention_heads=40, num_kv_heads=8,
               head_dim=128, intermediate_size=16384, vocab_size=202048, max_position_embeddings=1048576,
               num_experts=128, num_experts_per_token=1, moe_intermediate_size=8192,
               shared_expert_intermediate_size=8192, shared_expert_gate=False, num_dense_layers=24,
               attention_chunk_size=8192, num_chunked_layers=36),
    # OpenAI's gpt-oss (tests/sim/test_gpt_oss.py checks the counts): 128-token windows on every other layer, 128 or
    # 32 experts of width 2,880, top-4, biases on q, k and v (the o, router and expert biases and the attention
    # sinks, 0.01% of the weights, are not counted). Total / active: gpt-oss-120b 116.8B / 5.71B, gpt-oss-20b 20.9B /
    # 4.19B with the embedding (the published 5.1B and 3.6B leave it out). Published in mxfp4 experts
    # (engine.quantization: mxfp4).
    _shape("gpt-oss-120b", 36, 2880, 64, 8, 2880, 201088, 131072, head_dim=64, qkv_bias=True, experts=128,
           experts_per_token=4, expert_width=2880, sliding_window=128, sliding_layers=18, stored="mxfp4"),
    _shape("gpt-oss-20b", 24, 2880, 64, 8, 2880, 201088, 131072, head_dim=64, qkv_bias=True, experts=32,
           experts_per_token=4, expert_width=2880, sliding_window=128, sliding_layers=12, stored="mxfp4"),
    # DeepSeek's (sim/deepseek_config.py reads their config.json files; tests/sim/test_deepseek_shapes.py checks
    # the counts). Total and active parameters (the active count with the embedding, which published figures may
    # leave out): deepseek-v3 671.0B / 37.6B (DeepSeek-R1 has V3's shape; the 14B multi-token-prediction module is
    # served; it drafts for speculative decoding, method mtp), deepseek-v2 235.7B / 21.4B, deepseek-v2-lite 15.7B / 2.66B, kimi-k2 1.03T / 32.9B.
    # DeepSeek-V3/R1 and Kimi K2 are published in block fp8, gpt-oss's experts in mxfp4 (stored_quantization: what
    # a simulation with engine.quantization null prices, as vLLM runs them).
    _deepseek("deepseek-v3", 61, 7168, 128, 18432, 129280, 163840, experts=256, experts_per_token=8,
              expert_width=2048, shared_experts=1, dense_layers=3, q_lora_rank=1536, mtp_layers=1, stored="fp8"),
    _deepseek("deepseek-v2", 60, 5120, 128, 12288, 102400, 163840, experts=160, experts_per_token=6,
              expert_width=1536, shared_experts=2, dense_layers=1, q_lora_rank=1536),
    _deepseek("deepseek-v2-lite", 27, 2048, 16, 10944, 102400, 163840, experts=64, experts_per_token=6,
              expert_width=1408, shared_experts=2, dense_layers=1, q_lora_rank=0),
    _deepseek("kimi-k2", 61, 7168, 64, 18432, 163840, 131072, experts=384, experts_per_token=8,
              expert_width=2048, shared_experts=1, dense_layers=1, q_lora_rank=1536, stored="fp8"),
    # The project's generated default models (engine/models/default_model.py; a test keeps them equal):
    # what real runs on the CPU use, and what their calibrated profiles describe.
    _shape("servesim-tiny", 2, 64, 4, 2, 176, 512, 2048),
    _shape("servesim-small", 8, 512, 8, 4, 1408, 8192, 4096),
    # The generated LLaVAs (engine/models/default_vision_model.py): those Llamas behind a small CLIP tower, whose
    # encoders sim/vision_encoders.py's MODEL_VISION_ENCODERS holds.
    _shape("servesim-tiny-llava", 2, 64, 4, 2, 176, 512, 2048),
    _shape("servesim-small-llava", 8, 512, 8, 4, 1408, 8192, 4096),
)}
# Short names, as engine.LLM(model="tiny" | "small" | "tiny-llava" | "small-llava") spells them.
for _name in ("tiny", "small", "tiny-llava", "small-llava"):
    MODEL_PRESETS[_name] = MODEL_PRESETS[f"servesim-{_name}"]


def resolve_model(value: str | dict | ModelShape) -> ModelShape:
    """A preset name, a path to a Hugging Face ``config.json`` (or a folder holding one), an inline dict
    of ``ModelShape`` fields, or a ``ModelShape`` (returned as is)."""
    if isinstance(value, ModelShape):
        return value
    if isinstance(value, dict):
        return _model_from_dict(value)
    if not isinstance(value, (str, Path)):
        raise ValueError(f"model: expected a preset name, a config.json path or a mapping, got {value!r}")
    preset = MODEL_PRESETS.get(str(value).lower())
    if preset is not None:
        return preset
    path = Path(value)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return model_from_hf_config(path)
    raise ValueError(f"model: {str(value)!r} is neither a preset ({', '.join(MODEL_PRESETS)}) "
                     f"nor a path to a Hugging Face config.json or a folder holding one")


def _model_from_dict(value: dict) -> ModelShape:
    known = {f.name for f in fields(ModelShape)}
    for key in value:
        if key not in known:
            raise ValueError(f"model: unknown key {key!r} (known keys: {', '.join(sorted(known))})")
    value = dict(value)
    if "head_dim" not in value and "hidden_size" in value and "num_attention_heads" in value:
        value["head_dim"] = value["hidden_size"] // value["num_attention_heads"]
    for f in fields(ModelShape):
        if f.name not in value and f.default is MISSING:
            raise ValueError(f"model: missing key {f.name!r}")
    return ModelShape(**value)
