"""The simulator's executor: the cost model answers how long the step takes; every request gets a token.

Requests run with ``ignore_eos`` and ``max_tokens`` equal to the workload's output length, so the
token's value never decides when a request stops: the scheduler's own stop check ends each request at
exactly its output length. One shared output (the same token for every request) keeps the executor's
cost O(1) per step; the scheduler ignores tokens "sampled" for incomplete prefill chunks, as it does
for the real runner.

The exception is parallel sampling (``workload.n``): the completions of one prompt share it, and with one
shared token their outputs would be alike too, so a preempted completion would recompute its output
from its siblings' cached blocks, which the real engine's completions (sampling different tokens)
never share. Completion i > 0 therefore samples ``token_id + i`` (``sample_own_token``).
"""

from __future__ import annotations

from engine.core.outputs import ModelRunnerOutput
from engine.core.scheduler_output import SchedulerOutput
from sim.cost_models import CostModel, StepFeatures
from sim.scheduled_batch import scheduler_output_features, step_batch


class SimulatedExecutor:
    def __init__(self, cost_model: CostModel, token_id: int = 0) -> None:
        self.cost_model = cost_model
        self.token_id = token_id
        self._time_features = getattr(cost_model, "step_time_from_features", None)
        self._sampled = [[token_id]]
        # The requests that sample another token than token_id (row token - token_id of _sampled).
        self.token_ids_by_request: dict[str, int] = {}
        self.last_duration = 0.0
        self.last_features: StepFeatures | None = None

    def sample_own_token(self, request_id: str, completion_index: int) -> None:
        """Completion ``completion_index`` (> 0) of a parallel-sampling prompt samples ``token_id + index``."""
        while len(self._sampled) <= completion_index:
            self._sampled.append([self.token_id + len(self._sampled)])
        self.token_ids_by_request[request_id] = self.token_id + completion_index

    def cost_model_time(self, features: StepFeatures) -> float:
        """The cost model's duration for a step described by its features."""
        if self._time_features is None:
            raise TypeError(f"cost model {self.cost_model!r} has no step_time_from_features")
        return self._time_features(features)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        features = scheduler_output_features(scheduler_output)
        self.last_features = features
        if not scheduler_output.total_num_scheduled_tokens:
            # Nothing ran (a step that only preempted): no time, and not a step a replay recorded.
            self.last_duration = 0.0
        elif self._time_features is not None:
            self.last_duration = self._time_features(features)
        else:
            self.last_duration = self.cost_model.step_time(step_batch(scheduler_output))
        # Every request reads row 0 (dict.fromkeys builds the index at C speed), but for those sampling their own.
        rows = dict.fromkeys(scheduler_output.num_scheduled_tokens, 0)
        own_tokens = self.token_ids_by_request
        if own_tokens:
            for request_id in rows.keys() & own_tokens.keys():
                rows[request_id] = own_tokens[request_id] - self.token_id
        return ModelRunnerOutput([], rows, self._sampled)
