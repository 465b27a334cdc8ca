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


class RealLoRASteps:
    """Call ``on_step`` after each executed step, before the recorder records it."""

    def __init__(self, lora_manager) -> None:
        self.manager = lora_manager
        self.adapter_of: dict[str, int] = {}
        self._loads = self._disk_loads = 0
        self._load_s = 0.0
        self.last_num_loads = 0
        self.last_num_disk_loads = 0
        self.last_load_s = 0.0

    def on_step(self, scheduler_output: SchedulerOutput, features: StepFeatures) -> None:
        count_step_adapters(self.adapter_of, scheduler_output, features)
        manager = self.manager
        loads, disk_loads, load_s = manager.slots.num_slot_loads, manager.host_cache.num_loads, manager.total_load_s
        self.last_num_loads = loads - self._loads
        self.last_num_disk_loads = disk_loads - self._disk_loads
        self.last_load_s = load_s - self._load_s
        self._loads, self._disk_loads, self._load_s = loads, disk_loads, load_s


class RecordedLoRASteps:
    """A replay's LoRA (sim/replay.py): the adapters of each step counted as in the recorded run, and its loads
    copied from the recorded step, in order. ``on_step`` returns no extra seconds: the recorded durations the
    replay runs on include the loads already."""

    def __init__(self, recorded_steps) -> None:
        steps = recorded_steps.sort_values("step")
        self._loads = steps["num_lora_loads"].tolist()
        self._disk_loads = steps["num_lora_disk_loads"].tolist()
        self._load_s = steps["lora_load_s"].tolist()
        self.adapter_of: dict[str, int] = {}
        self.num_steps = 0
        self.last_num_loads = 0
        self.last_num_disk_loads = 0
        self.last_load_s = 0.0

    def on_step(self, scheduler_output: SchedulerOutput, features: StepFeatures) -> float:
        count_step_adapters(self.adapter_of, scheduler_output, features)
        index = self.num_steps
        self.num_steps += 1
        if index < len(self._loads):  # past the recording, the replay has diverged: its cost model says so
            self.last_num_loads = int(self._loads[index])
            self.last_num_disk_loads = int(self._disk_loads[index])
            self.last_load_s = float(self._load_s[index])
        return 0.0
