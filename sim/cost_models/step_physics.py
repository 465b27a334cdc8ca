"""A step's total FLOPs and HBM bytes, counted from the model's shape alone: the physics the analytical cost
model (analytical.py) must never beat. Tests check that no predicted step runs faster than these counts at the
datasheet's peak FLOP/s and bandwidth, and that a mixture of experts computes with k experts per token while
reading the weights of every expert some token is routed to."""

from __future__ import annotations

from sim.cost_models.attention_work import attention_work
from sim.cost_models.routed_experts import expected_distinct_experts
from sim.cost_models.step_batch import StepBatch, step_features
from sim.model_shapes import ModelShape, dtype_bytes


def step_flops_and_bytes(model: ModelShape, batch: StepBatch, dtype: str, kv_cache_dtype: str) -> tuple[float, float]:
    """Total FLOPs and HBM bytes of one step of ``model`` (whole, not a tensor-parallel shard) in ``dtype``, its
    KV cache stored as ``kv_cache_dtype``."""
    f = step_features(batch)
    m, element_bytes = model, dtype_bytes(dtype)
    attention = attention_work(m, element_bytes, dtype_bytes(kv_cache_dtype))
    layers, moe_layers = m.num_layers, m.num_moe_layers
    # Projections every token goes through: attention in every layer, the dense MLP in the dense layers, the
    # router and shared expert in the MoE layers.
    attention_params = sum(p.parameters for p in attention.projections)
    context = attention.context_projection
    if context is not None:  # latent attention's kv_b_proj: each query row, and each cached token prefills read
        attention_params += context.parameters
    moe_params = m.router_parameters + m.shared_expert_parameters + m.shared_expert_gate_parameters
    linear_params = layers * attention_params + m.num_dense_mlp_layers * m.dense_mlp_parameters \
        + moe_layers * moe_params
    flops = 2 * f.num_tokens * linear_params \
        + layers * (attention.decode_flops_per_pair * (f.decode_context_tokens + f.spec_attention_work)
                    + attention.prefill_flops_per_pair * f.prefill_attention_work) \
        + 2 * (f.num_reqs + f.num_spec_tokens) * m.hidden_size * m.vocab_size
    if context is not None:
        flops += layers * 2 * context.parameters * f.prefill_context_tokens
    kv_tokens_read = f.decode_context_tokens + f.prefill_context_tokens
    kv_read = layers * attention.kv_bytes_per_cached_token * kv_tokens_read
    weights = (linear_params + m.hidden_size * m.vocab_size) * element_bytes
    if m.is_moe:
        # Each token through k experts; the weights of the experts some token is routed to, on average.
        flops += moe_layers * 2 * f.num_tokens * m.num_experts_per_token * m.expert_parameters
        distinct = expected_distinct_experts(f.num_tokens, m.num_experts, m.num_experts_per_token)
        weights += moe_layers * distinct * m.expert_parameters * element_bytes
    return float(flops), float(weights + kv_read)
