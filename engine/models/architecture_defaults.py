"""transformers' per-model defaults for the config.json keys a checkpoint may omit, by ``model_type`` (config.py
reads them; the architecture-specific keys are read beside each model: gemma_config.py, deepseek_config.py,
gpt_oss_config.py, granite_config.py, nope_layers.py)."""

from __future__ import annotations

from typing import Any

from engine.models.deepseek_config import DEEPSEEK_MODEL_TYPES

# transformers' per-model defaults for keys a config.json may omit. "sliding_window" and
# "num_key_value_heads" apply only when the key is absent: an explicit null means "none" (full
# attention) and "as many as the attention heads", as in transformers' config classes.
ARCHITECTURE_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
              "attention_bias": False, "mlp_bias": False, "max_position_embeddings": 2048,
              "sliding_window": None, "num_key_value_heads": None},
    "qwen2": {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
              "attention_bias": True, "mlp_bias": False, "max_position_embeddings": 32768,
              "sliding_window": 4096, "num_key_value_heads": 32},
    "mistral": {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
                "attention_bias": False, "mlp_bias": False, "max_position_embeddings": 4096 * 32,
                "sliding_window": 4096, "num_key_value_heads": 8},
    "mixtral": {"rms_norm_eps": 1e-5, "rope_theta": 1e6, "tie_word_embeddings": False,
                "attention_bias": False, "mlp_bias": False, "max_position_embeddings": 4096 * 32,
                "sliding_window": None, "num_key_value_heads": 8},
    "qwen2_moe": {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
                  "attention_bias": True, "mlp_bias": False, "max_position_embeddings": 32768,
                  "sliding_window": None, "num_key_value_heads": 16},
    # Qwen3's head_dim is a key of its own (128 by default), not hidden_size / num_attention_heads.
    "qwen3": {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
              "attention_bias": False, "mlp_bias": False, "max_position_embeddings": 32768,
              "sliding_window": 4096, "num_key_value_heads": 32, "head_dim": 128},
    "qwen3_moe": {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
                  "attention_bias": False, "mlp_bias": False, "max_position_embeddings": 32768,
                  "sliding_window": None, "num_key_value_heads": 4},
    # Gemma 2, and Gemma 3's text model (gemma_config.py reads what is their own: RoPE per layer kind, the
    # window pattern, the caps).
    "gemma2": {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": True,
               "attention_bias": False, "mlp_bias": False, "max_position_embeddings": 8192,
               "sliding_window": 4096, "num_key_value_heads": 4, "head_dim": 256},
    "gemma3_text": {"rms_norm_eps": 1e-6, "rope_theta": 1e6, "tie_word_embeddings": True,
                    "attention_bias": False, "mlp_bias": False, "max_position_embeddings": 131072,
                    "sliding_window": 4096, "num_key_value_heads": 4, "head_dim": 256},
    # DeepSeek-V2/V3 and Kimi K2 (a DeepSeek-V3): multi-head latent attention; deepseek_config.py reads the rest.
    **{model_type: {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
                    "attention_bias": False, "mlp_bias": False,
                    "max_position_embeddings": 2048 if model_type == "deepseek_v2" else 4096,
                    "sliding_window": None, "num_key_value_heads": None}
       for model_type in DEEPSEEK_MODEL_TYPES},
    # Granite 3.x: Llama's layers with four multipliers (granite.py).
    "granite": {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
                "attention_bias": False, "mlp_bias": False, "max_position_embeddings": 2048,
                "sliding_window": None, "num_key_value_heads": None},
    # Cohere Command-R: LayerNorm, parallel attention and MLP, interleaved RoPE, scaled logits (cohere.py).
    "cohere": {"rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True,
               "attention_bias": False, "mlp_bias": False, "max_position_embeddings": 8192,
               "sliding_window": None, "num_key_value_heads": None},
    # Cohere2 (Command-R7B, Command-A): Cohere's block, windowed layers with RoPE, full ones without (nope_layers.py).
    "cohere2": {"rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True,
                "attention_bias": False, "mlp_bias": False, "max_position_embeddings": 8192,
                "sliding_window": 4096, "num_key_value_heads": None},
    # SmolLM3: Llama with every fourth layer without RoPE (nope_layers.py).
    "smollm3": {"rms_norm_eps": 1e-6, "rope_theta": 2000000.0, "tie_word_embeddings": True,
                "attention_bias": False, "mlp_bias": False, "max_position_embeddings": 32768,
                "sliding_window": None, "num_key_value_heads": 4},
    # GLM-4.5 / 4.5-Air: grouped-query attention with RoPE on half of each head, DeepSeek-V3's experts (glm4_moe.py).
    "glm4_moe": {"rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
                 "attention_bias": False, "mlp_bias": False, "max_position_embeddings": 131072,
                 "sliding_window": None, "num_key_value_heads": 8},
    # StarCoder2: biased projections, LayerNorms, a plain GELU MLP (starcoder2.py).
    "starcoder2": {"rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True,
                   "attention_bias": True, "mlp_bias": True, "max_position_embeddings": 4096,
                   "sliding_window": None, "num_key_value_heads": 2},
    # OLMo 2: Llama's projections with the norms after each block and over whole q and k (olmo2.py).
    "olmo2": {"rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
              "attention_bias": False, "mlp_bias": False, "max_position_embeddings": 2048,
              "sliding_window": None, "num_key_value_heads": None},
    # GLM-4 and GLM-4-0414: Llama's stack, RoPE on half of each head by interleaved pairs, q/k/v biases (glm.py).
    "glm": {"rms_norm_eps": 1.5625e-07, "rope_theta": 10000.0, "tie_word_embeddings": False,
            "attention_bias": True, "mlp_bias": False, "max_position_embeddings": 131072,
            "sliding_window": None, "num_key_value_heads": 2},
    "glm4": {"rms_norm_eps": 1.5625e-07, "rope_theta": 10000.0, "tie_word_embeddings": False,
             "attention_bias": True, "mlp_bias": False, "max_position_embeddings": 131072,
             "sliding_window": None, "num_key_value_heads": 2},
    # Seed-OSS: Llama with q/k/v biases by default and a switch of its own for the output projection's (seed_oss.py).
    "seed_oss": {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
                 "attention_bias": True, "mlp_bias": False, "max_position_embeddings": 524288,
                 "sliding_window": None, "num_key_value_heads": 8},
    # EXAONE 4.0: OLMo 2's blocks, per-head q/k norms, windowed layers with RoPE and full ones without (exaone4.py).
    "exaone4": {"rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
                "attention_bias": False, "mlp_bias": False, "max_position_embeddings": 2048,
                "sliding_window": 4096, "num_key_value_heads": 32},
    # ERNIE 4.5 (dense): Llama with interleaved RoPE and one use_bias for every projection (ernie4_5.py).
    "ernie4_5": {"rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True,
                 "attention_bias": False, "mlp_bias": False, "max_position_embeddings": 131072,
                 "sliding_window": None, "num_key_value_heads": 2},
    # Hunyuan dense: Llama with per-head q/k norms after RoPE and NTK-alpha RoPE (hunyuan.py).
    "hunyuan_v1_dense": {"rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
                         "attention_bias": False, "mlp_bias": False, "max_position_embeddings": 2048,
                         "sliding_window": None, "num_key_value_heads": None},
    # InternLM3: Llama with qkv_bias and bias switches of its own (internlm3.py).
    "internlm3": {"rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
                  "attention_bias": False, "mlp_bias": False, "max_position_embeddings": 32768,
                  "sliding_window": None, "num_key_value_heads": 2},
    # OLMo 3: OLMo 2 with three layers in four in a 4,096-token window (olmo3_config.py).
    "olmo3": {"rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False,
              "attention_bias": False, "mlp_bias": False, "max_position_embeddings": 2048,
              "sliding_window": 4096, "num_key_value_heads": None},
    # Llama 4 (Scout, Maverick): its language model; head_dim is a key of its own (llama4_config.py).
    "llama4_text": {"rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False,
                    "attention_bias": False, "mlp_bias": False, "max_position_embeddings": 4096 * 32,
                    "sliding_window": None, "num_key_value_heads": 8, "head_dim": 128},
    # Phi-3 and Phi-4: Llama's layers with q/k/v and gate/up fused in the checkpoint too (phi3.py).
    "phi3": {"rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
             "attention_bias": False, "mlp_bias": False, "max_position_embeddings": 4096,
             "sliding_window": None, "num_key_value_heads": None},
    # gpt-oss: biased attention with sinks, every other layer windowed, YaRN by default (gpt_oss_config.py).
    "gpt_oss": {"rms_norm_eps": 1e-5, "rope_theta": 150000.0, "tie_word_embeddings": False,
                "attention_bias": True, "mlp_bias": False, "max_position_embeddings": 131072,
                "sliding_window": 128, "num_key_value_heads": 8, "head_dim": 64},
}
