"""One projection (a dense GEMM) on the roofline: the analytical cost model's unit of linear-layer time."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sim.model_shapes import dtype_bytes

if TYPE_CHECKING:
    from sim.hardware import HardwareSpec
    from sim.weight_quantization import WeightQuantization

FP8_BYTES = 1


@dataclass(frozen=True, slots=True)
class LinearCost:
    """One projection on the roofline, in seconds: weights once per step, compute and activations per row."""
    name: str
    in_features: int
    out_features: int
    weight_read_s: float
    compute_s_per_row: float
    activation_s_per_row: float

    def time(self, rows: int) -> float:
        return max(rows * self.compute_s_per_row, self.weight_read_s + rows * self.activation_s_per_row)

    def is_compute_bound(self, rows: int) -> bool:
        return rows * self.compute_s_per_row > self.weight_read_s + rows * self.activation_s_per_row

    def flops(self, rows: int) -> int:
        return 2 * rows * self.in_features * self.out_features

    def bytes_moved(self, rows: int, element_bytes: int) -> int:
        return (self.in_features * self.out_features + rows * (self.in_features + self.out_features)) * element_bytes


def linear_costs(hardware: HardwareSpec, dtype: str, scheme: WeightQuantization | None
                 ) -> Callable[..., LinearCost]:
    """``linear(name, in_features, out_features, quantized=False)``: one projection's ``LinearCost`` on ``hardware``
    in ``dtype``, its weights in ``scheme``'s bytes when ``quantized`` (fp8 products at the fp8 rate where the
    device has one; other schemes weight-only, at the 16-bit rate)."""
    element_bytes = dtype_bytes(dtype)
    gemm_flops = hardware.achievable_gemm_flops(dtype)
    bandwidth = hardware.achievable_bandwidth

    def linear(name: str, in_features: int, out_features: int, quantized: bool = False) -> LinearCost:
        weight_bytes = scheme.bytes_per_weight if quantized else element_bytes
        fp8_products = quantized and scheme.fp8_tensor_cores and hardware.dense_fp8_tflops > 0
        flops = hardware.achievable_gemm_flops(dtype, scheme.name) if fp8_products else gemm_flops
        row_bytes = (in_features + out_features) * element_bytes
        if fp8_products:
            # fp8 x fp8 products: each input row is first quantized (read in dtype, written in fp8), then read by
            # the product in fp8.
            row_bytes += 2 * in_features * FP8_BYTES
        return LinearCost(name, in_features, out_features,
                          weight_read_s=in_features * out_features * weight_bytes / bandwidth,
                          compute_s_per_row=2 * in_features * out_features / flops,
                          activation_s_per_row=row_bytes / bandwidth)

    return linear
