"""A simulated engine's LoRA, step by step: which adapters each batch uses, and the loads it pays before computing.

The executor calls ``on_step`` once per step with tokens: it learns each new request's adapter from the
scheduler's output (as a runner does), counts the step's adapter tokens and distinct adapters into its
``StepFeatures`` (``num_lora_tokens``, ``num_active_loras``: what the cost model prices, sim/cost_models/
lora_cost.py), makes the batch's adapters active (sim/lora_slots.py) and returns the seconds its loads take,
which the step pays before its forward pass.

A decode fast-forward (engine/core/decode_fast_forward.py) schedules every running request each step until it
finishes, so its steps' adapters only ever leave: ``plan_fast_forward`` gives each planned step's counts and the
first step's loads (the later steps use a subset of its adapters, all active), and ``commit_fast_forward``
leaves the slots as the ordinary steps would (each adapter last used in the last step one of its requests ran).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from engine.core.scheduler_output import SchedulerOutput
from sim.cost_models import StepFeatures
from sim.lora_adapters import LoRASetup
from sim.lora_slots import AdapterLoad, LoRASlots


def count_step_adapters(adapter_of: dict[str, int], scheduler_output: SchedulerOutput, features: StepFeatures
                        ) -> set[int]:
    """Set the step's adapter tokens and distinct adapters in ``features`` and return the adapters' ids.
    ``adapter_of`` (request id -> adapter id) learns new requests' adapters and forgets finished ones, as a
    runner's request states do."""
    for new_request in scheduler_output.scheduled_new_reqs:
        if new_request.lora_request is not None:
            adapter_of[new_request.req_id] = new_request.lora_request.lora_int_id
    adapters: set[int] = set()
    num_lora_tokens = 0
    if adapter_of:
        for request_id, num_tokens in scheduler_output.num_scheduled_tokens.items():
            adapter = adapter_of.get(request_id)
            if adapter is not None:
                num_lora_tokens += num_tokens
                adapters.add(adapter)
    for request_id in scheduler_output.finished_req_ids:
        adapter_of.pop(request_id, None)
    features.num_lora_tokens = num_lora_tokens
    features.num_active_loras = len(adapters)
    return adapters


class LoRASteps:
    def __init__(self, setup: LoRASetup) -> None:
        self.setup = setup
        self.slots = LoRASlots(setup.max_loras, setup.max_cpu_loras)
        self.adapter_of: dict[str, int] = {}  # request id -> the runner's adapter id (base-model requests absent)
        self.num_steps = 0
        # The last recorded step's loads (read by the trace recorder).
        self.last_num_loads = 0
        self.last_num_disk_loads = 0
        self.last_load_s = 0.0

    def load_seconds(self, loads: Sequence[AdapterLoad]) -> float:
        setup = self.setup
        return sum(setup.copy_s[load.int_id] + (setup.disk_read_s[load.int_id] if load.from_disk else 0.0)
                   for load in loads)

    def _note_loads(self, loads: Sequence[AdapterLoad]) -> float:
        self.last_num_loads = len(loads)
        self.last_num_disk_loads = sum(load.from_disk for load in loads)
        self.last_load_s = self.load_seconds(loads) if loads else 0.0
        return self.last_load_s

    def on_step(self, scheduler_output: SchedulerOutput, features: StepFeatures) -> float:
        """Count the step's adapters into ``features``, activate them, and return the seconds of its loads."""
        adapters = count_step_adapters(self.adapter_of, scheduler_output, features)
        loads = self.slots.admit(adapters, self.num_steps) if adapters else []
        self.num_steps += 1
        return self._note_loads(loads)

    def plan_fast_forward(self, requests: Sequence, last_steps: Sequence[int]) -> FastForwardLoRA:
        """The adapters of a fast-forward over ``requests`` (running order), request i decoding in steps
        0..``last_steps[i]``."""
        last_by_adapter: dict[int, int] = {}
        request_last_steps = []
        for request, last_step in zip(requests, last_steps):
            lora = request.lora_request
            if lora is not None:
                request_last_steps.append(last_step)
                adapter = lora.lora_int_id
                if last_by_adapter.get(adapter, -1) < last_step:
                    last_by_adapter[adapter] = last_step
        first_loads = self.slots.copy().admit(last_by_adapter.keys(), self.num_steps) if last_by_adapter else []
        return FastForwardLoRA(sorted(request_last_steps), sorted(last_by_adapter.values()), last_by_adapter,
                               self.load_seconds(first_loads) if first_loads else 0.0)

    def commit_fast_forward(self, plan: FastForwardLoRA, num_steps: int) -> None:
        """Leave the slots as ``num_steps`` ordinary steps of the plan would, and note the first step's loads."""
        loads = self.slots.admit(plan.last_by_adapter.keys(), self.num_steps) if plan.last_by_adapter else []
        base = self.num_steps
        touch = self.slots.touch
        for adapter, last_step in plan.last_by_adapter.items():
            touch((adapter,), base + min(last_step, num_steps - 1))
        self.num_steps += num_steps
        self._note_loads(loads)


class FastForwardLoRA:
    """Per planned step, the adapter tokens and distinct adapters; the first step's load seconds."""

    __slots__ = ("_request_last_steps", "_adapter_last_steps", "last_by_adapter", "first_load_s")

    def __init__(self, request_last_steps: list[int], adapter_last_steps: list[int], last_by_adapter: dict[int, int],
                 first_load_s: float) -> None:
        self._request_last_steps = request_last_steps
        self._adapter_last_steps = adapter_last_steps
        self.last_by_adapter = last_by_adapter
        self.first_load_s = first_load_s

    def counts(self, step: int) -> tuple[int, int]:
        """(adapter tokens, distinct adapters) of planned step ``step``: one decode token per request still running."""
        return (len(self._request_last_steps) - bisect_left(self._request_last_steps, step),
                len(self._adapter_last_steps) - bisect_left(self._adapter_last_steps, step))
