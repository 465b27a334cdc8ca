"""Mistral: for our purposes the Llama architecture.

Mistral checkpoints may declare a ``sliding_window``. Our attention backends attend over the full
context, which is exact as long as no sequence grows beyond the window; the runner must therefore cap
``max_model_len`` at ``sliding_window`` (``max_model_len_limit`` says so). Longer sequences would need
a windowed mask in the backends, which is not implemented.
"""

from __future__ import annotations

from engine.models.llama import LlamaForCausalLM


class MistralForCausalLM(LlamaForCausalLM):
    pass
