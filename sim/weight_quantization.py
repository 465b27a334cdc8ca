"""Weight quantization schemes (``engine.quantization``): which weights a scheme stores in fewer bits, how many
bytes each then takes, and whether the products run at a faster tensor-core rate.

* ``fp8`` (vLLM's ``--quantization fp8``; DeepSeek-V3's published weights): every layer's projections and every
  expert in one byte; the router, norms, embedding and lm_head in the model's dtype. The products run at the
  device's fp8 tensor-core rate where it has one (activations quantized per row on the way in).
* ``mxfp4`` (OCP microscaling FP4; gpt-oss's published weights): the routed experts only, 4 bits a weight plus an
  8-bit scale per 32 (4.25 bits, 0.53125 bytes); attention, routers and the rest stay in the model's dtype. vLLM
  runs them weight-only on Hopper and earlier (Marlin / Triton kernels widen them to 16 bits in the GEMM), which
  is how they are priced here on every device: fewer bytes, the 16-bit rate (no FP4 tensor-core rate is
  modelled, a pessimistic figure for Blackwell).
* ``w4a16`` / ``w8a16`` (llm-compressor's and GPTQ/AWQ's weight-only integers; the real engine loads such
  compressed-tensors checkpoints): every projection and expert in 4 bits plus a 16-bit scale per group of 128
  (4.125 bits, 0.515625 bytes), or in 8 bits (a scale per row, negligible); multiplied at the 16-bit rate, as
  vLLM's Marlin / Machete kernels widen them on the way into the product.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the shape imports this module
    from sim.model_shapes import ModelShape


@dataclass(frozen=True, slots=True)
class WeightQuantization:
    name: str
    bytes_per_weight: float
    experts_only: bool          # True: only routed experts are quantized; False: every projection and expert
    fp8_tensor_cores: bool      # the products run at the device's fp8 rate (where it has one)


SCHEMES = {
    "fp8": WeightQuantization("fp8", 1.0, experts_only=False, fp8_tensor_cores=True),
    "mxfp4": WeightQuantization("mxfp4", 4.25 / 8, experts_only=True, fp8_tensor_cores=False),
    "w4a16": WeightQuantization("w4a16", (4 + 16 / 128) / 8, experts_only=False, fp8_tensor_cores=False),
    "w8a16": WeightQuantization("w8a16", 1.0, experts_only=False, fp8_tensor_cores=False),
}


def weight_quantization(name: str | None, model: ModelShape | None = None) -> WeightQuantization | None:
    """The scheme called ``name`` (None: none); a ValueError naming ``engine.quantization`` for an unknown one, or
    for an experts-only scheme on ``model`` when it has no experts."""
    if name is None:
        return None
    scheme = SCHEMES.get(str(name).lower())
    if scheme is None:
        raise ValueError(f"engine.quantization: unknown scheme {name!r}; known: {', '.join(SCHEMES)}")
    if model is not None and scheme.experts_only and not model.is_moe:
        raise ValueError(f"engine.quantization: {scheme.name} quantizes a mixture of experts' routed experts only, "
                         f"and {model.name!r} has none")
    return scheme


def quantized_parameters(model: ModelShape, scheme: WeightQuantization, num_dense_mlp_layers: int,
                         num_moe_layers: int) -> int:
    """Weights ``scheme`` stores quantized in that many layers of each kind."""
    if scheme.experts_only:
        return num_moe_layers * model.num_experts * model.expert_parameters
    return num_dense_mlp_layers * model.dense_layer_linear_parameters \
        + num_moe_layers * model.moe_layer_linear_parameters
