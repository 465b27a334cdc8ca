"""gpt-oss (``GptOssForCausalLM``: gpt-oss-20b and gpt-oss-120b, as bfloat16 or float32 checkpoints).

On the Llama skeleton (fused, biased q/k/v; RoPE in halves; pre-norm residual layers), with:

* **attention sinks**: each head has a learned logit ``sinks[h]`` that joins its softmax's denominator and attends
  nothing, so a head can give the context little weight in total (the torch and triton backends apply them;
  flash-attn 2 has none and is refused);
* every other layer attends a sliding window (128 tokens), the rest the full context: vLLM's hybrid KV cache
  (engine/core/kv_cache_grouping.py) gives each kind its own blocks, the windowed ones handed back;
* an MoE MLP in every layer: a biased router whose top-k logits are softmaxed into the weights, and experts
  stored as transformers holds them: ``gate_up_proj`` [E, hidden, 2 * I] with gate and up interleaved by column,
  ``down_proj`` [E, I, hidden], each with a bias; the activation is ``(clamp(up, -L, L) + 1) * g * sigmoid(alpha *
  g)`` with ``g = min(gate, L)`` (``swiglu_limit`` L = 7, ``swiglu_alpha`` 1.702).

OpenAI's published checkpoints store the experts in MXFP4 (``quantization_config`` quant_method mxfp4:
``experts.gate_up_proj_blocks`` and ``_scales`` [E, 2 * I, hidden / 32, 16] and [E, 2 * I, hidden / 32], likewise
``down_proj``); they are dequantized at load into the layout above (mxfp4.py), so the model is the quantized one,
run in 16 or 32 bits. bfloat16 copies load as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.config import ModelConfig, MoEConfig
from engine.models.llama import LlamaForCausalLM
from engine.models.moe import rows_by_expert
from engine.models.mxfp4 import dequantize_mxfp4
from engine.runner.attention import AttentionBackend

_MXFP4_PARTS = ("_blocks", "_scales")


class GptOssExperts(nn.Module):
    """``num_experts`` clamped-SwiGLU experts in transformers' layout (module docstring), each run once on the rows
    routed to it."""

    def __init__(self, moe: MoEConfig, hidden_size: int, swiglu_limit: float, swiglu_alpha: float) -> None:
        super().__init__()
        experts, width = moe.num_experts, moe.expert_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(experts, hidden_size, 2 * width))
        self.gate_up_proj_bias = nn.Parameter(torch.empty(experts, 2 * width))
        self.down_proj = nn.Parameter(torch.empty(experts, width, hidden_size))
        self.down_proj_bias = nn.Parameter(torch.empty(experts, hidden_size))
        self.limit, self.alpha = swiglu_limit, swiglu_alpha

    def activation(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate = gate_up[..., 0::2].clamp(max=self.limit)
        up = gate_up[..., 1::2].clamp(min=-self.limit, max=self.limit)
        return (up + 1) * (gate * torch.sigmoid(gate * self.alpha))

    def forward(self, hidden_states: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        # Experts in increasing id, as transformers visits them, so the sums round the same way.
        output = torch.zeros_like(hidden_states)
        for expert, tokens, token_weights in rows_by_expert(expert_ids, weights, self.gate_up_proj.shape[0]):
            gate_up = hidden_states[tokens] @ self.gate_up_proj[expert] + self.gate_up_proj_bias[expert]
            expert_output = self.activation(gate_up) @ self.down_proj[expert] + self.down_proj_bias[expert]
            output.index_add_(0, tokens, (expert_output * token_weights[:, None]).to(output.dtype))
        return output


class GptOssMoeBlock(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        moe = config.moe
        self.top_k = moe.num_experts_per_token
        self.router = nn.Linear(config.hidden_size, moe.num_experts, bias=True)
        self.experts = GptOssExperts(moe, config.hidden_size, float(config.raw.get("swiglu_limit", 7.0)),
                                     float(config.raw.get("swiglu_alpha", 1.702)))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        top_logits, expert_ids = self.router(hidden_states).topk(self.top_k, dim=-1)
        weights = F.softmax(top_logits, dim=-1, dtype=top_logits.dtype)  # over the chosen experts only
        return self.experts(hidden_states, expert_ids, weights)


class GptOssForCausalLM(LlamaForCausalLM):
    # The experts' row counts are read on the host, as for the other mixtures (moe_model.py).
    cuda_graph_unsafe_reason = "the experts' row counts are read on the host (data-dependent shapes)"
    unsupported_attention_backends = {"flash_attn": "attention sinks (gpt-oss; flash-attn 2 has none)"}

    def __init__(self, config: ModelConfig, attention_backend: str | AttentionBackend = "torch") -> None:
        super().__init__(config, attention_backend)
        for layer in self.model.layers:
            layer.self_attn.sinks = nn.Parameter(torch.empty(config.num_attention_heads))

    @classmethod
    def check_config(cls, config: ModelConfig) -> None:
        if config.model_type != "gpt_oss" or config.moe is None:
            raise ValueError(f"GptOssForCausalLM needs a gpt_oss config, got model_type {config.model_type!r}")

    @classmethod
    def make_mlp(cls, config: ModelConfig, layer_index: int) -> nn.Module:
        return GptOssMoeBlock(config)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return super().load_weights(self._dequantized(weights))

    def _dequantized(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """The checkpoint's tensors, each MXFP4 pair (``X_blocks``, ``X_scales``) replaced by ``X`` in the model's
        dtype once both have been read; a part whose partner never comes is reported missing by its name."""
        dtype = self.model.embed_tokens.weight.dtype
        pending: dict[str, dict[str, torch.Tensor]] = {}
        for name, tensor in weights:
            part = next((part for part in _MXFP4_PARTS if name.endswith(part)), None)
            if part is None:
                yield name, tensor
                continue
            parts = pending.setdefault(name[:-len(part)], {})
            parts[part] = tensor
            if len(parts) == 2:
                target = name[:-len(part)]
                del pending[target]
                # [E, out, G, 16] -> [E, out, in] -> transformers' [E, in, out].
                yield target, dequantize_mxfp4(parts["_blocks"], parts["_scales"], dtype).transpose(1, 2)
        if pending:
            target, parts = next(iter(pending.items()))
            missing = next(part for part in _MXFP4_PARTS if part not in parts)
            raise ValueError(f"checkpoint has {target}{next(iter(parts))} but not {target}{missing} (MXFP4 weights "
                             "come as blocks and scales)")
