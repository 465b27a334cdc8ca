"""Mixture-of-experts models of the Llama family: Mixtral, Qwen2-MoE and Qwen3-MoE.

Attention, norms, embedding and head are Llama's; each layer's MLP is a ``SparseMoeBlock`` (moe.py), or a
dense SwiGLU for the layers a Qwen2-MoE or Qwen3-MoE config keeps dense. What differs between them is the
checkpoint's naming, the attention biases and Qwen3's q/k norms:

* Mixtral: ``block_sparse_moe.gate`` (the router) and ``block_sparse_moe.experts.{e}.w1/w3/w2`` (gate, up,
  down); no biases.
* Qwen2-MoE: ``mlp.gate``, ``mlp.experts.{e}.gate_proj/up_proj/down_proj``, a shared expert
  (``mlp.shared_expert.*``) and its gate ``mlp.shared_expert_gate``; a bias on q, k and v.
* Qwen3-MoE: Qwen2-MoE's names without the shared expert; Qwen3's attention (q_norm and k_norm; biases on
  q, k, v and o_proj only when ``attention_bias``, as in Llama).

All also load from transformers 5's in-memory layout (``mlp.experts.gate_up_proj`` and
``mlp.experts.down_proj`` as stacked tensors), which is how our parameters are laid out. A per-expert
tensor fills one expert's slice and is reported as ``...experts.gate_up_proj#{e}/gate`` (and ``up``,
``down``), so a missing expert is named in the loader's error. Qwen3-VL-MoE's published checkpoints stack them
the other way round ([experts, hidden, 2 x intermediate] and [experts, intermediate, hidden], for a batched
matmul); a stacked tensor of that shape is transposed at load, as transformers 5 does (a tensor already of our
shape is taken as it is, which decides the square case the same way).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch
from torch import nn

from engine.models.config import ModelConfig
from engine.models.layers import SwiGLUMLP
from engine.models.llama import LlamaForCausalLM, gate_or_up_rows
from engine.models.moe import SparseMoeBlock

_STACKED = ("gate_up_proj", "down_proj")  # the experts' two stacked parameters
_PART_TO_STACKED = {"gate": "gate_up_proj", "up": "gate_up_proj", "down": "down_proj"}


class MoeForCausalLM(LlamaForCausalLM):
    # How the checkpoint names the MLP module and each expert's projections.
    checkpoint_mlp_name = "mlp"
    checkpoint_expert_parts: dict[str, str] = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down"}
    # StackedExperts reads each expert's row count on the host to size its matmuls; a captured graph would
    # replay the counts of the capture. (vLLM's fused MoE kernel sizes its work on the device instead.)
    cuda_graph_unsafe_reason = "the experts' row counts are read on the host (data-dependent shapes)"

    @classmethod
    def check_config(cls, config: ModelConfig) -> None:
        if config.moe is None:
            raise ValueError(f"{config.architecture} needs a mixture-of-experts config (model_type "
                             f"{config.model_type!r} has none)")

    @classmethod
    def make_mlp(cls, config: ModelConfig, layer_index: int) -> nn.Module:
        if layer_index in config.moe.dense_layers:
            return SwiGLUMLP(config.hidden_size, config.intermediate_size, config.mlp_bias, config.hidden_act)
        return SparseMoeBlock(config.hidden_size, config.moe)

    # ---- weight loading -------------------------------------------------------------------------

    def _expert_pattern(self) -> re.Pattern:
        parts = "|".join(map(re.escape, self.checkpoint_expert_parts))
        return re.compile(rf"^(.*)\.{re.escape(self.checkpoint_mlp_name)}\.experts\.(\d+)\.({parts})\.weight$")

    def _map_weight_name(self, name: str) -> tuple[str, str | None]:
        match = self._expert_pattern().match(name)
        if match:
            prefix, expert, part = match.groups()
            role = self.checkpoint_expert_parts[part]
            return f"{prefix}.mlp.experts.{_PART_TO_STACKED[role]}", f"{int(expert)}/{role}"
        if self.checkpoint_mlp_name != "mlp":
            name = name.replace(f".{self.checkpoint_mlp_name}.", ".mlp.")
        return super()._map_weight_name(name)

    def _shard_view(self, target: str, destination: torch.Tensor, shard: str) -> torch.Tensor:
        expert, slash, role = shard.partition("/")
        if not slash:
            return super()._shard_view(target, destination, shard)
        if int(expert) >= destination.shape[0]:
            # Reported by name, not as an IndexError: the config has fewer experts than the checkpoint.
            raise ValueError(f"checkpoint has expert {expert} for {target!r}, but config.json declares "
                             f"{destination.shape[0]} experts")
        one_expert = destination[int(expert)]
        return one_expert if role == "down" else gate_or_up_rows(one_expert, role)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        loaded = super().load_weights(self._stacked_in_our_layout(weights))
        # A stacked tensor loaded whole (transformers 5's layout) fills every expert's shards at once.
        for key in [key for key in loaded if key.rsplit(".", 1)[-1] in _STACKED]:
            loaded.discard(key)
            loaded.update(self._expert_shard_keys(key))
        return loaded

    def _stacked_in_our_layout(self, weights: Iterable[tuple[str, torch.Tensor]]
                               ) -> Iterable[tuple[str, torch.Tensor]]:
        """Stacked expert tensors in the batched-matmul layout turned into ours (the module docstring)."""
        moe = self.config.moe
        hidden, intermediate = self.config.hidden_size, moe.expert_intermediate_size
        ours = {"gate_up_proj": (moe.num_experts, 2 * intermediate, hidden),
                "down_proj": (moe.num_experts, hidden, intermediate)}
        for name, tensor in weights:
            shape = ours.get(name.rsplit(".", 1)[-1]) if ".experts." in name else None
            if shape is not None and tuple(tensor.shape) != shape and tuple(tensor.shape) == (shape[0], *shape[:0:-1]):
                tensor = tensor.transpose(1, 2)
            yield name, tensor

    def expected_weight_keys(self) -> set[str]:
        expected = set()
        for key in super().expected_weight_keys():
            if ".mlp.experts." in key:
                expected.update(self._expert_shard_keys(key))
            else:
                expected.add(key)
        return expected

    def _expert_shard_keys(self, stacked: str) -> list[str]:
        roles = ("gate", "up") if stacked.endswith("gate_up_proj") else ("down",)
        num_experts = self.config.moe.num_experts
        return [f"{stacked}#{expert}/{role}" for expert in range(num_experts) for role in roles]

    def checkpoint_name(self, key: str) -> str:
        target, _, shard = key.partition("#")
        expert, slash, role = shard.partition("/")
        if slash:
            part = next(part for part, part_role in self.checkpoint_expert_parts.items() if part_role == role)
            prefix = target.rsplit(".mlp.experts.", 1)[0]
            return f"{prefix}.{self.checkpoint_mlp_name}.experts.{expert}.{part}.weight"
        name = super().checkpoint_name(key)
        if self.checkpoint_mlp_name != "mlp" and ".mlp.gate." in name:
            return name.replace(".mlp.", f".{self.checkpoint_mlp_name}.")
        return name


class MixtralForCausalLM(MoeForCausalLM):
    """Mixtral: Mistral's attention (a declared sliding window caps max_model_len, as for Mistral) and 8 experts,
    top-2, renormalized."""
    checkpoint_mlp_name = "block_sparse_moe"
    checkpoint_expert_parts = {"w1": "gate", "w3": "up", "w2": "down"}

    @classmethod
    def attention_biases(cls, config: ModelConfig) -> tuple[bool, bool]:
        return False, False


class Qwen2MoeForCausalLM(MoeForCausalLM):
    """Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2's biased q/k/v, routed experts and a gated shared expert."""

    @classmethod
    def attention_biases(cls, config: ModelConfig) -> tuple[bool, bool]:
        return config.attention_bias, False


class Qwen3MoeForCausalLM(MoeForCausalLM):
    """Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention, routed experts without a shared one."""
    qk_norm = True
