"""A real run's LoRA, step by step: the adapters each batch used and the loads the runner made for it.

The recorder's LoRA columns (sim/trace_recorder.py: adapter tokens, distinct adapters, loads, loads from disk,
load seconds) come from the simulator's own slots in a simulated run (sim/lora_steps.py); in a real run the
runner's LoRA manager (engine/runner/lora/manager.py) is the source: its counters of slot fills, disk reads and
seconds spent filling slots, read after each step. The counts of adapter tokens and adapters are the
simulator's function, so both kinds of run fill the columns the same way.
"""

from __future__ import annotations

from engine.core.scheduler_output import SchedulerOutput
from sim.cost_models import StepFeatures
from sim.lora_steps import count_step_adapters


class _StepLoRARecord:
    """What the trace recorder reads of a step's LoRA (the interface of sim/lora_steps.LoRASteps): the step's adapter
    tokens and adapters, counted into its features from the schedule, and its loads (``last_*``), which a subclass
    says where to find (``_step_loads``)."""

    def __init__(self) -> None:
        self.adapter_of: dict[str, int] = {}
        self.last_num_loads = 0
        self.last_num_disk_loads = 0
        self.last_load_s = 0.0

    def on_step(self, scheduler_output: SchedulerOutput, features: StepFeatures) -> float:
        """Count the step's adapters into ``features`` and note its loads; no seconds are added to the step (a real
        run's duration, and a replay's recorded one, include the loads already)."""
        count_step_adapters(self.adapter_of, scheduler_output, features)
        loads = self._step_loads()
        if loads is not None:
            self.last_num_loads, self.last_num_disk_loads, self.last_load_s = loads
        return 0.0

    def _step_loads(self) -> tuple[int, int, float] | None:
        raise NotImplementedError


class RealLoRASteps(_StepLoRARecord):
    """Call ``on_step`` after each executed step, before the recorder records it."""

    def __init__(self, lora_manager) -> None:
        super().__init__()
        self.manager = lora_manager
        self._loads = self._disk_loads = 0
        self._load_s = 0.0

    def _step_loads(self) -> tuple[int, int, float]:
        """The runner's counters' growth since the last step."""
        manager = self.manager
        loads, disk_loads, load_s = manager.slots.num_slot_loads, manager.host_cache.num_loads, manager.total_load_s
        step = (loads - self._loads, disk_loads - self._disk_loads, load_s - self._load_s)
        self._loads, self._disk_loads, self._load_s = loads, disk_loads, load_s
        return step


class RecordedLoRASteps(_StepLoRARecord):
    """A replay's LoRA (sim/replay.py): the adapters of each step counted as in the recorded run, and its loads
    copied from the recorded step, in order."""

    def __init__(self, recorded_steps) -> None:
        super().__init__()
        steps = recorded_steps.sort_values("step")
        self._loads = steps["num_lora_loads"].tolist()
        self._disk_loads = steps["num_lora_disk_loads"].tolist()
        self._load_s = steps["lora_load_s"].tolist()
        self.num_steps = 0

    def _step_loads(self) -> tuple[int, int, float] | None:
        index = self.num_steps
        self.num_steps += 1
        if index >= len(self._loads):  # past the recording, the replay has diverged: its cost model says so
            return None
        return int(self._loads[index]), int(self._disk_loads[index]), float(self._load_s[index])
