"""Hunyuan dense (``HunYuanDenseV1ForCausalLM``: Tencent's Hunyuan-0.5B to 7B): the Llama architecture with per-head
q/k RMSNorms applied after RoPE (``query_layernorm``, ``key_layernorm``), and RoPE whose base NTK-``alpha`` stretches
(``rope_scaling`` type ``dynamic`` with an ``alpha``: base ``rope_theta * alpha ** (head_dim / (head_dim - 2))``,
fixed, not dependent on the sequence; read by config.py)."""

from __future__ import annotations

from engine.models.llama import LlamaForCausalLM

_CHECKPOINT_NORMS = {".query_layernorm.": ".q_norm.", ".key_layernorm.": ".k_norm."}


class HunYuanDenseV1ForCausalLM(LlamaForCausalLM):
    qk_norm = True
    qk_norm_after_rope = True

    def _map_weight_name(self, name: str) -> tuple[str, str | None]:
        for theirs, ours in _CHECKPOINT_NORMS.items():
            name = name.replace(theirs, ours)
        return super()._map_weight_name(name)

    def checkpoint_name(self, key: str) -> str:
        name = super().checkpoint_name(key)
        for theirs, ours in _CHECKPOINT_NORMS.items():
            name = name.replace(ours, theirs)
        return name
