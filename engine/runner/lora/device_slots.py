"""The ``max_loras`` adapter slots on the device, assigned to the adapters of each step's batch.

An adapter keeps its slot while it stays resident, so a batch that uses the same adapters as the last one
copies nothing. A step that needs an adapter without a slot takes a free one, else the least recently used
slot whose adapter this batch does not use. The core never lets the running requests use more than
``max_loras`` adapters (engine/core/waiting_admission.py), and a step's batch is a subset of them, so a slot
is always found; a runner driven without that guarantee gets a RuntimeError rather than a wrong answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from engine.core.lora import LoRARequest
from engine.models.lora_checkpoint import LoRAWeights
from engine.runner.lora.lora_linear import LoRALinear


class LoRASlots:
    def __init__(self, modules: Sequence[LoRALinear], max_loras: int) -> None:
        self.modules = list(modules)
        self.max_loras = max_loras
        self.slot_lora_ids: list[int | None] = [None] * max_loras
        self._last_used = [0] * max_loras
        self._step = 0
        self.num_slot_loads = 0  # adapters copied into a slot, for tests and logs

    def assign(self, lora_requests: Sequence[LoRARequest],
               get_weights: Callable[[LoRARequest], LoRAWeights]) -> dict[int, int]:
        """A slot for each adapter (lora_int_id -> slot), filling slots from ``get_weights`` as needed."""
        self._step += 1
        needed = {request.lora_int_id for request in lora_requests}
        if len(needed) > self.max_loras:
            raise RuntimeError(f"the batch uses {len(needed)} LoRA adapters, more than max_loras {self.max_loras}")
        slots: dict[int, int] = {}
        for request in lora_requests:
            lora_id = request.lora_int_id
            if lora_id in slots:
                continue
            if lora_id in self.slot_lora_ids:
                slot = self.slot_lora_ids.index(lora_id)
            else:
                slot = self._free_slot(needed)
                self._fill(slot, get_weights(request))
                self.slot_lora_ids[slot] = lora_id
            self._last_used[slot] = self._step
            slots[lora_id] = slot
        return slots

    def _free_slot(self, needed: set[int]) -> int:
        candidates = [slot for slot, lora_id in enumerate(self.slot_lora_ids) if lora_id not in needed]
        empty = [slot for slot in candidates if self.slot_lora_ids[slot] is None]
        if empty:
            return empty[0]
        return min(candidates, key=lambda slot: self._last_used[slot])  # non-empty: len(needed) <= max_loras

    @torch.inference_mode()
    def _fill(self, slot: int, adapter: LoRAWeights) -> None:
        """Copy the adapter into ``slot`` of every module, B scaled in float32 before the cast to the model's
        dtype (so a half-precision slot rounds scale * B once)."""
        self.num_slot_loads += 1
        for module in self.modules:
            slices = {}
            for index, name in enumerate(module.slice_names):
                pair = adapter.weights.get((module.layer_index, name))
                if pair is not None:
                    a, b = pair
                    slices[index] = (a, b * adapter.scale)
            module.set_slot(slot, adapter.rank, slices)
