"""Replaying a real run's step timeline instead of predicting it.

Given the ``steps.parquet`` of a real run, the i-th step the simulator takes lasts exactly as long as
the real run's i-th step did. Because the scheduler is shared, the simulated run must then schedule
exactly what the real run scheduled; each step checks that it does (same scheduled token count) and
stops the replay at the first divergence, naming the step.
"""

from __future__ import annotations

from collections.abc import Sequence

from sim.cost_models.step_batch import StepBatch, StepFeatures, step_features


class ReplayDivergedError(RuntimeError):
    """The simulated run scheduled something the real run did not."""


class ReplayCostModel:
    name = "replay"

    def __init__(self, durations: Sequence[float], scheduled_tokens: Sequence[int], source: str = "") -> None:
        if len(durations) != len(scheduled_tokens):
            raise ValueError("durations and scheduled_tokens must have one entry per step")
        self.durations = [float(value) for value in durations]
        self.scheduled_tokens = [int(value) for value in scheduled_tokens]
        self.source = source
        self.next_step = 0

    @classmethod
    def from_steps(cls, steps, source: str = "") -> "ReplayCostModel":
        """From a steps DataFrame (``analysis.read_run(path).steps``)."""
        ordered = steps.sort_values("step")
        return cls(ordered["duration"].tolist(), ordered["num_scheduled_tokens"].tolist(), source)

    def step_time(self, batch: StepBatch) -> float:
        return self.step_time_from_features(step_features(batch))

    def step_time_from_features(self, features: StepFeatures) -> float:
        step = self.next_step
        if step >= len(self.durations):
            raise ReplayDivergedError(f"the simulation took more steps than the {len(self.durations)} recorded")
        if features.num_tokens != self.scheduled_tokens[step]:
            raise ReplayDivergedError(f"step {step}: the simulation scheduled {features.num_tokens} tokens, "
                                      f"the recorded run {self.scheduled_tokens[step]}")
        self.next_step = step + 1
        return self.durations[step]

    @property
    def finished(self) -> bool:
        return self.next_step == len(self.durations)

    def describe(self) -> dict:
        return {"kind": "replay", "source": self.source, "num_steps": len(self.durations)}
