"""The sparse mixture-of-experts MLP (Mixtral, Qwen2-MoE) for a flat batch of tokens.

A router scores every token against every expert; each token goes to its top-k experts, and the layer's
output is the sum of those experts' SwiGLU outputs weighted by the routing probabilities. The experts'
weights are stacked, ``gate_up_proj`` [num_experts, 2 * intermediate, hidden] and ``down_proj``
[num_experts, hidden, intermediate] (the layout transformers 5 uses in memory), so a layer's experts are
two parameters whatever their number, and one expert's weights are a view.

The computation groups the (token, expert) pairs by expert (one stable sort of the flat top-k ids) and
runs each expert that received tokens once, on all of its rows: the work is top-k rows per token, not one
pass per expert over the whole batch. Experts are visited in increasing id and their outputs added in that
order, as transformers adds them, so the float32 sums round the same way.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.config import MoEConfig
from engine.models.layers import SwiGLUMLP


class SparseMoeBlock(nn.Module):
    def __init__(self, hidden_size: int, moe: MoEConfig) -> None:
        super().__init__()
        self.num_experts = moe.num_experts
        self.top_k = moe.num_experts_per_token
        self.intermediate_size = moe.expert_intermediate_size
        self.normalize_top_k = moe.normalize_top_k
        self.routing_weights_in_float32 = moe.routing_weights_in_float32
        self.gate = nn.Linear(hidden_size, moe.num_experts, bias=False)  # the router
        self.experts = StackedExperts(moe.num_experts, hidden_size, moe.expert_intermediate_size)
        if moe.shared_expert_intermediate_size:
            self.shared_expert = SwiGLUMLP(hidden_size, moe.shared_expert_intermediate_size, bias=False)
            self.shared_expert_gate = nn.Linear(hidden_size, 1, bias=False)
        else:
            self.shared_expert = None

    def route(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[T, hidden] -> (top-k expert ids [T, k], their weights [T, k])."""
        probabilities = F.softmax(self.gate(hidden_states), dim=-1, dtype=torch.float32)
        weights, expert_ids = torch.topk(probabilities, self.top_k, dim=-1)
        if self.normalize_top_k:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        if not self.routing_weights_in_float32:
            weights = weights.to(hidden_states.dtype)
        return expert_ids, weights

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        expert_ids, weights = self.route(hidden_states)
        output = self.experts(hidden_states, expert_ids, weights)
        if self.shared_expert is not None:
            shared = torch.sigmoid(self.shared_expert_gate(hidden_states)) * self.shared_expert(hidden_states)
            output = output + shared
        return output


class StackedExperts(nn.Module):
    """``num_experts`` SwiGLU MLPs in two stacked parameters, run on the rows routed to each."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.intermediate_size = intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))

    def forward(self, hidden_states: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        output = torch.zeros_like(hidden_states)
        for expert, tokens, token_weights in rows_by_expert(expert_ids, weights, self.gate_up_proj.shape[0]):
            gate, up = F.linear(hidden_states[tokens], self.gate_up_proj[expert]).split(self.intermediate_size, dim=-1)
            expert_output = F.linear(F.silu(gate) * up, self.down_proj[expert])
            # The weight may be float32 (Mixtral): the product is then float32, cast back as it is added.
            output.index_add_(0, tokens, (expert_output * token_weights[:, None]).to(output.dtype))
        return output


def rows_by_expert(expert_ids: torch.Tensor, weights: torch.Tensor, num_experts: int
                   ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """For each expert that received rows, in increasing id: (expert, its tokens [n], their routing weights [n]).

    ``expert_ids``/``weights`` [T, k]. Pair p = token * k + slot; one stable sort of the flat ids groups the pairs
    by expert with each expert's tokens in order, so every expert runs once on all of its rows."""
    top_k = expert_ids.shape[1]
    flat_ids = expert_ids.reshape(-1)
    order = torch.sort(flat_ids, stable=True).indices
    rows_per_expert = torch.bincount(flat_ids, minlength=num_experts).tolist()
    token_of_pair, weight_of_pair = order // top_k, weights.reshape(-1)[order]
    start = 0
    for expert, rows in enumerate(rows_per_expert):
        if rows:
            yield expert, token_of_pair[start:start + rows], weight_of_pair[start:start + rows]
            start += rows
