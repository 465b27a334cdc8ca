"""One projection (a dense GEMM) on the roofline: the analytical cost model's unit of linear-layer time."""

from __future__ import annotations

from dataclasses import dataclass


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
