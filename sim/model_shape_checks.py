"""The checks a ModelShape's fields must pass, beyond each being a positive integer: which keys each layer's
attention reads (a sliding window, chunked local attention) and a mixture of experts' fields. Each failure names the
field and the value, as a workload's inline ``model:`` mapping spells it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the shape imports this module
    from sim.model_shapes import ModelShape


def check_attention_span(shape: ModelShape) -> None:
    """A sliding window or chunked local attention, and how many layers have it (the rest attend everything)."""
    if shape.sliding_window is not None and (not isinstance(shape.sliding_window, int)
                                            or isinstance(shape.sliding_window, bool) or shape.sliding_window < 1):
        raise ValueError(f"model.sliding_window must be a positive integer or null, got {shape.sliding_window!r}")
    if shape.num_sliding_layers is not None and (
            shape.sliding_window is None or not isinstance(shape.num_sliding_layers, int)
            or isinstance(shape.num_sliding_layers, bool) or not 1 <= shape.num_sliding_layers <= shape.num_layers):
        raise ValueError(f"model.num_sliding_layers must be 1..num_layers ({shape.num_layers}) with a "
                         f"sliding_window, got {shape.num_sliding_layers!r}")
    if shape.attention_chunk_size is not None and (
            not isinstance(shape.attention_chunk_size, int) or isinstance(shape.attention_chunk_size, bool)
            or shape.attention_chunk_size < 1 or shape.sliding_window is not None):
        raise ValueError(f"model.attention_chunk_size must be a positive integer (and no sliding_window beside "
                         f"it) or null, got {shape.attention_chunk_size!r}")
    if shape.num_chunked_layers is not None and (
            shape.attention_chunk_size is None or not isinstance(shape.num_chunked_layers, int)
            or isinstance(shape.num_chunked_layers, bool) or not 1 <= shape.num_chunked_layers <= shape.num_layers):
        raise ValueError(f"model.num_chunked_layers must be 1..num_layers ({shape.num_layers}) with an "
                         f"attention_chunk_size, got {shape.num_chunked_layers!r}")


def check_experts(shape: ModelShape) -> None:
    """A mixture of experts' fields, or none of them for a dense model."""
    for name in ("num_experts", "num_experts_per_token", "moe_intermediate_size",
                 "shared_expert_intermediate_size"):
        value = getattr(shape, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"model.{name} must be an integer >= 0, got {value!r}")
    if shape.num_experts == 0:
        for name in ("num_experts_per_token", "moe_intermediate_size", "shared_expert_intermediate_size"):
            if getattr(shape, name):
                raise ValueError(f"model.{name} is {getattr(shape, name)}, but model.num_experts is 0 (a dense "
                                 "model); set num_experts for a mixture of experts")
        if shape.num_dense_layers:
            raise ValueError(f"model.num_dense_layers is {shape.num_dense_layers}, but model.num_experts is 0: "
                             "every layer of a dense model is dense; set num_experts for a mixture of experts")
        return
    if not isinstance(shape.num_dense_layers, int) or isinstance(shape.num_dense_layers, bool) \
            or not 0 <= shape.num_dense_layers < shape.num_layers:
        raise ValueError(f"model.num_dense_layers must be 0..num_layers - 1 ({shape.num_layers - 1}) for a mixture "
                         f"of experts, got {shape.num_dense_layers!r}")
    if not 1 <= shape.num_experts_per_token <= shape.num_experts:
        raise ValueError(f"model.num_experts_per_token must be 1..num_experts ({shape.num_experts}) for a "
                         f"mixture of experts, got {shape.num_experts_per_token}")
    if shape.moe_intermediate_size < 1:
        raise ValueError("model.moe_intermediate_size must be a positive integer for a mixture of experts "
                         f"(num_experts {shape.num_experts}), got {shape.moe_intermediate_size}")
    if not shape.gated_mlp:
        raise ValueError("model.gated_mlp must be true for a mixture of experts: experts are modelled as "
                         "SwiGLU MLPs (gate, up, down)")
