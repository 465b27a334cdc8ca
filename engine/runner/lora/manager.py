"""The runner's LoRA state: the model's LoRA slots, the host cache, and each step's rows per adapter.

Each request's adapter arrives once, in its NewRequestData, and stays in its CachedRequestState (resumed
requests keep it); the input batch keeps every row's ``lora_int_id`` (0: the base model). Per step,
``prepare_step`` finds the batch's adapters, gives each a device slot, and groups the flat token indices
by slot for every LoRALinear to read; a batch of base-model requests only gets ``None`` and the forward
does no LoRA work at all. Logits are computed from the adapted hidden states, so sampling, logprobs, prompt
logprobs and speculative decoding's verification all see the adapter.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from torch import nn

from engine.core.lora import LoRARequest
from engine.models.lora_checkpoint import LoRAWeights
from engine.runner.input_batch import InputBatch
from engine.runner.lora.config import LoRAConfig
from engine.runner.lora.device_slots import LoRASlots
from engine.runner.lora.host_cache import LoRAHostCache
from engine.runner.lora.lora_linear import LoRABatch, LoRAStepContext
from engine.runner.lora.model_wrapping import target_shapes, wrap_model


class LoRAManager:
    def __init__(self, model: nn.Module, config: LoRAConfig, device: torch.device) -> None:
        self.config = config
        self.device = device
        self.context = LoRAStepContext()
        modules = wrap_model(model, config.max_loras, config.max_lora_rank, self.context)
        self.host_cache = LoRAHostCache(config.host_cache_size, target_shapes(model), config.max_lora_rank)
        self.slots = LoRASlots(modules, config.max_loras)
        # Seconds spent giving steps' adapters their slots (reading from disk and copying in), all steps together:
        # real runs record each step's share (sim/real_lora_steps.py), as the simulator prices its loads.
        self.total_load_s = 0.0

    def add_lora(self, lora_request: LoRARequest) -> LoRAWeights:
        """Read and check the adapter into the host cache (the front end calls this when a request is added)."""
        return self.host_cache.get(lora_request)

    def remove_lora(self, lora_int_id: int) -> bool:
        """Release the adapter's name (the server unloaded it); running requests still run it (host_cache.py)."""
        return self.host_cache.remove_lora(lora_int_id)

    def prepare_step(self, batch: InputBatch, num_scheduled_tokens: np.ndarray) -> LoRABatch | None:
        """Slots for the batch's adapters and their rows, set for the forward (None: no adapter this step)."""
        num_reqs = len(num_scheduled_tokens)
        row_lora_ids = batch.lora_int_ids[:num_reqs]
        if not row_lora_ids.any():
            self.context.batch = None
            return None
        requests: dict[int, LoRARequest] = {}
        for row in np.flatnonzero(row_lora_ids).tolist():
            lora_request = batch.request_states[row].lora_request
            requests.setdefault(lora_request.lora_int_id, lora_request)
        loads_before = self.slots.num_slot_loads
        started = time.perf_counter()
        slots = self.slots.assign(list(requests.values()), self.host_cache.get)
        if self.slots.num_slot_loads != loads_before:
            self.total_load_s += time.perf_counter() - started
        token_lora_ids = np.repeat(row_lora_ids, num_scheduled_tokens)
        groups = []
        for lora_id, slot in slots.items():
            token_indices = torch.from_numpy(np.flatnonzero(token_lora_ids == lora_id))
            groups.append((slot, token_indices.to(self.device, non_blocking=True)))
        self.context.batch = LoRABatch(groups)
        return self.context.batch

    def finish_step(self) -> None:
        self.context.batch = None
