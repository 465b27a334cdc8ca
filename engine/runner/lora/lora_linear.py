"""A linear layer with LoRA slots: the base projection, plus each adapter's low-rank update on its rows.

    out = x W^T (+ bias)                                 every row, the base weights untouched
    out[rows of adapter a, slice s] += (x A_s^T) B_s^T   for each adapter a in the step, each slice s it adapts

A fused projection is several slices of one output (``qkv_proj``: q, k, v; ``gate_up_proj``: gate, up),
each with its own A and B, as PEFT trains them on the separate projections. A slot packs the slices an
adapter adapts side by side: ``lora_a`` is [max_loras, num_slices * max_lora_rank, in_features] with the
adapted slices' A stacked along the rank, and ``lora_b`` is [max_loras, out_features, num_slices *
max_lora_rank] holding each slice's B in its own output rows and rank columns (block diagonal), zeros
everywhere else, so padding adds nothing. The adapter's scale is folded into B when the slot is filled
(engine/runner/lora/device_slots.py). A step then costs two matmuls per adapter and projection at the
adapter's own rank times its number of slices, however many slices the projection has.

Rows are grouped by adapter: one loop over the step's distinct adapters (at most max_loras), each an
``index_select`` of its rows, the two matmuls, and an ``index_add_`` back (skipped when the adapter has
every row). A gathered bmm (one [rank, in] matrix per token) would instead copy every token's weights and
multiply at the padded rank; with few adapters per step the loop does dense matmuls at the adapters'
ranks and no per-token copies. A step whose batch uses no adapter (``LoRABatch`` unset) does no tensor
work beyond the base projection.
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
        width = len(slice_sizes) * max_lora_rank
        # Buffers, not parameters: the model's parameters stay exactly the checkpoint's.
        self.register_buffer("lora_a", torch.zeros(max_loras, width, base.in_features, dtype=weight.dtype,
                                                   device=weight.device), persistent=False)
        self.register_buffer("lora_b", torch.zeros(max_loras, base.out_features, width, dtype=weight.dtype,
                                                   device=weight.device), persistent=False)
        # Per slot: the packed rank (the adapter's rank times the slices it adapts), read without a sync.
        self.slot_width = [0] * max_loras

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    def set_slot(self, slot: int, rank: int, slices: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Fill ``slot`` with an adapter of rank ``rank``: ``slices[s] = (A [rank, in], scaled B [out_s, rank])``
        for the slices it adapts, packed side by side; everything else in the slot becomes zero."""
        lora_a, lora_b = self.lora_a[slot], self.lora_b[slot]
        lora_a.zero_()
        lora_b.zero_()
        column = 0
        for index in sorted(slices):
            a, b = slices[index]
            offset, size = self.slice_offsets[index], self.slice_sizes[index]
            lora_a[column:column + rank].copy_(a)
            lora_b[offset:offset + size, column:column + rank].copy_(b)
            column += rank
        self.slot_width[slot] = column

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        batch = self.context.batch
        if batch is None:
            return out
        for slot, token_indices in batch.groups:
            width = self.slot_width[slot]
            if not width:
                continue  # the adapter leaves this projection alone
            every_row = token_indices.shape[0] == x.shape[0]  # indices are distinct: all of them, in order
            rows = x if every_row else x.index_select(0, token_indices)
            delta = (rows @ self.lora_a[slot, :width].T) @ self.lora_b[slot, :, :width].T
            if every_row:
                out += delta
            else:
                out.index_add_(0, token_indices, delta)
        return out
