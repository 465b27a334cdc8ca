"""A layer's MLP on the roofline, for one GPU's shard: a dense gated MLP, or a mixture of experts (a router, the
routed experts as grouped GEMMs, a shared expert). The analytical cost model (analytical.py) prices each layer
as its attention and one of these; DeepSeek's models have both kinds (dense MLPs in their first layers)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sim.cost_models.linear_cost import LinearCost
from sim.cost_models.routed_experts import RoutedExpertsCost
from sim.model_shapes import ModelShape

# Kernels of a dense MLP: gate+up, activation, down.
DENSE_MLP_KERNELS = 3
# vLLM's fused MoE sequence: router projection, top-k softmax, aligning and sorting the rows by expert, the
# gate+up grouped GEMM, activation, the down grouped GEMM, and the weighted sum of each token's k rows.
MOE_KERNELS = 7
# A shared expert adds gate+up, activation, down, and scaling and adding its output; Qwen2-MoE's gate a projection.
SHARED_EXPERT_KERNELS = 4
# Top-k writes, per token and chosen expert, a weight (fp32) and an expert id (int32).
TOP_K_BYTES_PER_CHOICE = 8


@dataclass(frozen=True, slots=True)
class MLPCost:
    """One layer's MLP: ``linears`` run on every token, ``routed_experts`` on each token's k experts (None for a
    dense MLP); ``elementwise_bytes_per_token`` the activation and the experts' data movement."""
    linears: tuple[LinearCost, ...]
    routed_experts: RoutedExpertsCost | None
    elementwise_bytes_per_token: dict[str, int]
    kernels: int


def dense_mlp_cost(shard: ModelShape, linear: Callable[..., LinearCost], quantized: bool,
                   element_bytes: int) -> MLPCost:
    h = shard.hidden_size
    return MLPCost(
        linears=(linear("gate_up_proj", h, shard.mlp_up_size, quantized),
                 linear("down_proj", shard.intermediate_size, h, quantized)),
        routed_experts=None,
        # SiLU-and-multiply reads gate and up and writes their product.
        elementwise_bytes_per_token={"activation": (shard.mlp_up_size + shard.intermediate_size) * element_bytes},
        kernels=DENSE_MLP_KERNELS)


def moe_mlp_cost(shard: ModelShape, linear: Callable[..., LinearCost], quantized: bool, experts_quantized: bool,
                 element_bytes: int) -> MLPCost:
    """A mixture-of-experts layer's MLP for one GPU's ``shard`` (every expert cut to 1/tp of its width);
    ``experts_quantized`` the routed experts' weights, ``quantized`` the shared expert's."""
    h, k = shard.hidden_size, shard.num_experts_per_token
    width, shared_width = shard.moe_intermediate_size, shard.shared_expert_intermediate_size
    # One expert's two grouped GEMMs, priced row by row as dense projections are (fp8 included).
    gate_up = linear("experts_gate_up", h, 2 * width, experts_quantized)
    down = linear("experts_down", width, h, experts_quantized)
    routed = RoutedExpertsCost(
        num_experts=shard.num_experts, experts_per_token=k,
        expert_weight_read_s=gate_up.weight_read_s + down.weight_read_s,
        compute_s_per_row=gate_up.compute_s_per_row + down.compute_s_per_row,
        activation_s_per_row=gate_up.activation_s_per_row + down.activation_s_per_row)
    # vLLM keeps the router (and the shared expert's gate) in the model's dtype under fp8.
    linears = (linear("router", h, shard.num_experts),)
    elementwise = {
        # SiLU-and-multiply on each token's k rows of the expert width (and on the shared expert's row).
        "activation": 3 * (k * width + shared_width) * element_bytes,
        # The hidden state copied to each token's k expert rows, and the k rows' outputs summed back into one
        # (weighted by the router's probabilities): read 1 + write k, then read k + write 1.
        "moe_permute_and_combine": 2 * (1 + k) * h * element_bytes,
        # Top-k softmax reads the token's logits and writes k (weight, expert id) pairs; the alignment
        # kernel's sort of the ids is of the same order.
        "router_top_k": shard.num_experts * element_bytes + k * TOP_K_BYTES_PER_CHOICE,
    }
    kernels = MOE_KERNELS
    if shared_width:
        linears += (linear("shared_expert_gate_up", h, 2 * shared_width, quantized),
                    linear("shared_expert_down", shared_width, h, quantized))
        kernels += SHARED_EXPERT_KERNELS
        if shard.shared_expert_gate:
            linears += (linear("shared_expert_gate", h, 1),)
            kernels += 1
        # (sigmoid(gate) *) shared output + routed output: read two rows (and the gate), write one.
        elementwise["shared_expert_combine"] = 3 * h * element_bytes
    return MLPCost(linears, routed, elementwise, kernels)
