"""DeepSeek-V2 and DeepSeek-V3 (and so DeepSeek-R1, Kimi K2, Moonlight): multi-head latent attention and
DeepSeek's mixture of experts on the Llama skeleton (embedding, pre-norm residual layers, final norm, head).

What the checkpoint holds, per layer: ``self_attn.{q_proj | q_a_proj, q_a_layernorm, q_b_proj}``,
``self_attn.kv_a_proj_with_mqa``, ``self_attn.kv_a_layernorm``, ``self_attn.kv_b_proj``, ``self_attn.o_proj``
(latent_attention.py), and an MLP: dense (``mlp.gate_proj/up_proj/down_proj``) for the first
``first_k_dense_replace`` layers, else ``mlp.gate.weight`` (the router; V3 adds
``mlp.gate.e_score_correction_bias``), ``mlp.experts.{e}.*`` and ``mlp.shared_experts.*``. DeepSeek-V3's
checkpoints also carry their multi-token-prediction layer as ``model.layers.{num_hidden_layers}.*``; as in
transformers, it is not part of the model and is skipped (the simulator prices MTP drafts: sim/mtp_draft.py).

The router runs in float32 from float32 weights whatever the model's dtype (transformers keeps ``gate.weight`` and
the correction bias in float32): a bias rounded to bfloat16 would change which experts are chosen.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.config import ModelConfig, MoEConfig
from engine.models.latent_attention import MultiHeadLatentAttention
from engine.models.layers import RMSNorm, SwiGLUMLP
from engine.models.llama import LlamaDecoderLayer, LlamaModel
from engine.models.moe import StackedExperts
from engine.models.moe_model import MoeForCausalLM
from engine.models.rotary_embedding import RotaryEmbedding
from engine.runner.attention import AttentionBackend, get_attention_backend

_LAYER_INDEX = re.compile(r"^model\.layers\.(\d+)\.")


class DeepseekRouter(nn.Module):
    """Scores every expert, keeps the best groups, picks the top-k experts among them and weighs them."""

    def __init__(self, hidden_size: int, moe: MoEConfig) -> None:
        super().__init__()
        self.routing = moe.deepseek_routing
        self.top_k, self.normalize_top_k = moe.num_experts_per_token, moe.normalize_top_k
        self.weight = nn.Parameter(torch.empty(moe.num_experts, hidden_size))
        self.e_score_correction_bias = (nn.Parameter(torch.empty(moe.num_experts))
                                        if self.routing.score_correction_bias else None)

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[T, hidden] -> (expert ids [T, k], float32 weights [T, k])."""
        routing = self.routing
        logits = F.linear(hidden_states.float(), self.weight.float())
        scores = logits.sigmoid() if routing.scoring == "sigmoid" else logits.softmax(dim=-1)
        # The bias steers the choice only (DeepSeek-V3's auxiliary-loss-free balancing); weights are the scores.
        choice = scores if self.e_score_correction_bias is None else scores + self.e_score_correction_bias.float()
        if routing.num_groups > 1:
            grouped = choice.view(choice.shape[0], routing.num_groups, -1)
            group_scores = (grouped.topk(2, dim=-1).values.sum(dim=-1) if routing.group_score == "top2_sum"
                            else grouped.max(dim=-1).values)
            kept_groups = group_scores.topk(routing.top_k_groups, dim=-1).indices
            kept = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, kept_groups, True)
            choice = choice.masked_fill(~kept[:, :, None].expand_as(grouped).reshape_as(choice), float("-inf"))
        expert_ids = choice.topk(self.top_k, dim=-1).indices
        weights = scores.gather(1, expert_ids)
        if self.normalize_top_k:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return expert_ids, weights * routing.routed_scaling_factor


class DeepseekMoeBlock(nn.Module):
    """Routed experts plus the shared experts every token passes through (ungated, unlike Qwen2-MoE's)."""

    def __init__(self, hidden_size: int, moe: MoEConfig, hidden_act: str) -> None:
        super().__init__()
        self.gate = DeepseekRouter(hidden_size, moe)
        self.experts = StackedExperts(moe.num_experts, hidden_size, moe.expert_intermediate_size)
        self.shared_experts = (SwiGLUMLP(hidden_size, moe.shared_expert_intermediate_size, False, hidden_act)
                               if moe.shared_expert_intermediate_size else None)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        expert_ids, weights = self.gate(hidden_states)
        output = self.experts(hidden_states, expert_ids, weights)
        if self.shared_experts is not None:
            output = output + self.shared_experts(hidden_states)
        return output


class DeepseekDecoderLayer(LlamaDecoderLayer):
    """Llama's pre-norm residual layer with latent attention."""

    def __init__(self, config: ModelConfig, backend: AttentionBackend, mlp: nn.Module) -> None:
        nn.Module.__init__(self)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = MultiHeadLatentAttention(config, backend)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = mlp


class DeepseekModel(LlamaModel):
    """Llama's decoder stack (its forward) with DeepSeek layers; RoPE spans the rope features only."""

    def __init__(self, config: ModelConfig, backend: AttentionBackend,
                 make_mlp: Callable[[int], nn.Module]) -> None:
        nn.Module.__init__(self)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DeepseekDecoderLayer(config, backend, make_mlp(index))
                                    for index in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config.mla.qk_rope_head_dim, config.rope_theta, config.rope_scaling)


class DeepseekV2ForCausalLM(MoeForCausalLM):
    # Only the MLPs' gate and up are fused; DeepSeek's q_proj (without q_lora_rank) is a projection of its own.
    stacked_params = {"gate_proj": ("gate_up_proj", "gate"), "up_proj": ("gate_up_proj", "up")}
    unsupported_attention_backends = dict.fromkeys(
        ("flash_attn", "triton"), "multi-head latent attention (DeepSeek-V2/V3: one cached latent per token, "
        "kv_lora_rank + qk_rope_head_dim wide, serves as keys and values)")
    float32_parameters = ("mlp.gate.weight", "mlp.gate.e_score_correction_bias")

    def __init__(self, config: ModelConfig, attention_backend: str | AttentionBackend = "torch") -> None:
        nn.Module.__init__(self)
        self.check_config(config)
        self.config = config
        backend = get_attention_backend(attention_backend, self.unsupported_attention_backends)
        self.model = DeepseekModel(config, backend, lambda layer_index: self.make_mlp(config, layer_index))
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(config.hidden_size, config.vocab_size,
                                                                          bias=False)

    @classmethod
    def check_config(cls, config: ModelConfig) -> None:
        if config.mla is None or config.moe is None or config.moe.deepseek_routing is None:
            raise ValueError(f"{config.architecture} needs a DeepSeek config (model_type deepseek_v2, deepseek_v3 or "
                             f"kimi_k2), got model_type {config.model_type!r}")

    @classmethod
    def make_mlp(cls, config: ModelConfig, layer_index: int) -> nn.Module:
        if layer_index in config.moe.dense_layers:
            return SwiGLUMLP(config.hidden_size, config.intermediate_size, False, config.hidden_act)
        return DeepseekMoeBlock(config.hidden_size, config.moe, config.hidden_act)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        # Layers past num_hidden_layers are the multi-token-prediction module (module docstring): skipped.
        num_layers = self.config.num_hidden_layers

        def decoder_weights():
            for name, tensor in weights:
                match = _LAYER_INDEX.match(name)
                if match is None or int(match.group(1)) < num_layers:
                    yield name, tensor
        return super().load_weights(decoder_weights())


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    """DeepSeek-V3 / R1 / Kimi K2: V2's layout with the sigmoid router and its correction bias (deepseek_config.py
    tells them apart by model_type)."""

