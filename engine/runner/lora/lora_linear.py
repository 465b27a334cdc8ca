"""A linear layer with LoRA slots: the base projection, plus each adapter's low-rank update on its rows.

    out = x W^T (+ bias)                                 every row, the base weights untouched
    out[rows of adapter a, slice s] += (x A_s^T) B_s^T   for each adapter a in the step, each slice s it adapts

A fused projection is several slices of one output (``qkv_proj``: q, k, v; ``gate_up_proj``: gate, up),
each with its own A and B, as PEFT trains them on the separate projections. Each slice's weights live in
``max_loras`` slots: ``lora_a[s]`` is [max_loras, max_lora_rank, in_features] and ``lora_b[s]`` is
[max_loras, slice_out, max_lora_rank], zero beyond the adapter's rank (so the padding adds nothing), with
the adapter's scale folded into B when the slot is filled (engine/runner/lora/device_slots.py).

Rows are grouped by adapter: one loop over the step's distinct adapters (at most max_loras), each an
``index_select`` of its rows, two small matmuls per adapted slice, and an ``index_add_`` back. A gathered
bmm (one [rank, in] matrix per token) would instead copy every token's weights and multiply at the
padded rank; with few adapters per step the loop does exact-rank dense matmuls and no per-token copies,
and it skips the slices an adapter does not target. A step whose batch uses no adapter (``LoRABatch``
unset) does no tensor work beyond the base projection.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(slots=True)
class LoRABatch:
    """This step's rows per adapter: ``groups`` is [(slot, flat token indices on the device)], one per
    distinct adapter in the batch; rows of base-model requests are in no group."""
    groups: list[tuple[int, torch.Tensor]]


class LoRAStepContext:
    """Shared by every LoRALinear of a model: the runner sets the step's batch before the forward and
    clears it after (None: no adapter in this step)."""

    def __init__(self) -> None:
        self.batch: LoRABatch | None = None


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, layer_index: int, slice_names: tuple[str, ...], slice_sizes: tuple[int, ...],
                 max_loras: int, max_lora_rank: int, context: LoRAStepContext) -> None:
        super().__init__()
        if sum(slice_sizes) != base.out_features:
            raise ValueError(f"slices {slice_sizes} do not cover {base.out_features} output features")
        self.base = base
        self.layer_index = layer_index
        self.slice_names = slice_names
        self.slice_offsets = tuple(sum(slice_sizes[:index]) for index in range(len(slice_sizes)))
        self.slice_sizes = slice_sizes
        self.context = context
        weight = base.weight
        # Buffers, not parameters: the model's parameters stay exactly the checkpoint's.
        for index, size in enumerate(slice_sizes):
            self.register_buffer(f"lora_a_{index}", torch.zeros(max_loras, max_lora_rank, base.in_features,
                                                               dtype=weight.dtype, device=weight.device),
                                 persistent=False)
            self.register_buffer(f"lora_b_{index}", torch.zeros(max_loras, size, max_lora_rank, dtype=weight.dtype,
                                                               device=weight.device), persistent=False)
        # Per slot: the adapter's rank, and the slices it adapts (host-side, read each step without a sync).
        self.slot_rank = [0] * max_loras
        self.slot_slices: list[tuple[int, ...]] = [()] * max_loras

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    def lora_a(self, index: int) -> torch.Tensor:
        return getattr(self, f"lora_a_{index}")

    def lora_b(self, index: int) -> torch.Tensor:
        return getattr(self, f"lora_b_{index}")

    def set_slot(self, slot: int, rank: int, slices: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Fill ``slot`` with an adapter of rank ``rank``: ``slices[s] = (A [rank, in], scaled B [out_s, rank])``
        for the slices it adapts; every other slice, and every column past ``rank``, becomes zero."""
        for index in range(len(self.slice_sizes)):
            lora_a, lora_b = self.lora_a(index), self.lora_b(index)
            lora_a[slot].zero_()
            lora_b[slot].zero_()
            if index in slices:
                a, b = slices[index]
                lora_a[slot, :rank].copy_(a)
                lora_b[slot, :, :rank].copy_(b)
        self.slot_rank[slot] = rank
        self.slot_slices[slot] = tuple(sorted(slices))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        batch = self.context.batch
        if batch is None:
            return out
        for slot, token_indices in batch.groups:
            rank = self.slot_rank[slot]
            rows = x.index_select(0, token_indices)
            for index in self.slot_slices[slot]:
                shrunk = rows @ self.lora_a(index)[slot, :rank].T
                delta = shrunk @ self.lora_b(index)[slot, :, :rank].T
                offset = self.slice_offsets[index]
                out[:, offset:offset + self.slice_sizes[index]].index_add_(0, token_indices, delta)
        return out
