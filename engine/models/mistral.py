"""Mistral: for our purposes the Llama architecture, with a sliding window on every layer.

A Mistral checkpoint's ``sliding_window`` (4096 for Mistral-7B-v0.1; null for later versions) applies to
every layer, as in transformers: a token attends itself and the ``sliding_window - 1`` tokens before it
(``ModelConfig.layer_sliding_windows``, applied by the attention backends). Because no layer reads keys
older than the window, the KV-cache manager hands their blocks back (``engine/core/kv_cache_manager.py``).
"""

from __future__ import annotations

from engine.models.llama import LlamaForCausalLM


class MistralForCausalLM(LlamaForCausalLM):
    pass
