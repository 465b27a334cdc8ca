"""The simulator's executor: the cost model answers how long the step takes; every request gets a token.

Requests run with ``ignore_eos`` and ``max_tokens`` equal to the workload's output length, so the
token's value never decides when a request stops: the scheduler's own stop check ends each request at
exactly its output length. One shared output (the same token for every request) keeps the executor's
cost O(1) per step; the scheduler ignores tokens "sampled" for incomplete prefill chunks, as it does
for the real runner.
"""

from __future__ import annotations

from engine.core.outputs import ModelRunnerOutput
from engine.core.scheduler_output import SchedulerOutput
from sim.cost_models import CostModel, StepBatch, StepFeatures


class SimulatedExecutor:
    def __init__(self, cost_model: CostModel, token_id: int = 0) -> None:
        self.cost_model = cost_model
        self.token_id = token_id
        self._time_features = getattr(cost_model, "step_time_from_features", None)
        self._sampled = [[token_id]]

    def cost_model_time(self, features: StepFeatures) -> float:
        """The cost model's duration for a step described by its features."""
        if self._time_features is None:
            raise TypeError(f"cost model {self.cost_model!r} has no step_time_from_features")
        return self._time_features(features)
        self.last_duration = 0.0
        self.last_features: StepFeatures | None = None

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        features = scheduler_output_features(scheduler_output)
        self.last_features = features
        if self._time_features is not None:
            self.last_duration = self._time_features(features)
        else:
            self.last_duration = self.cost_model.step_time(step_batch(scheduler_output))
        # Every request reads row 0: dict.fromkeys builds the index at C speed.
        return ModelRunnerOutput([], dict.fromkeys(scheduler_output.num_scheduled_tokens, 0), self._sampled)


def step_batch(scheduler_output: SchedulerOutput) -> StepBatch:
    """The cost model's view of a step: per scheduled request, new tokens and tokens already cached."""
    num_scheduled_tokens = scheduler_output.num_scheduled_tokens
    scheduled = [num_scheduled_tokens[new.req_id] for new in scheduler_output.scheduled_new_reqs]
    computed = [new.num_computed_tokens for new in scheduler_output.scheduled_new_reqs]
    cached = scheduler_output.scheduled_cached_reqs
    scheduled += [num_scheduled_tokens[request_id] for request_id in cached.req_ids]
    computed += cached.num_computed_tokens
    return StepBatch(scheduled, computed)


def scheduler_output_features(scheduler_output: SchedulerOutput) -> StepFeatures:
    """``step_features(step_batch(scheduler_output))`` in one pass, without building the batch.

    This runs once per simulated step, so it reads the scheduler's output directly; a test checks it
    against the two-step definition.
    """
    num_scheduled_tokens = scheduler_output.num_scheduled_tokens
    cached = scheduler_output.scheduled_cached_reqs
    num_decode_reqs = decode_context_tokens = 0
    num_prefill_reqs = num_prefill_tokens = prefill_context_tokens = prefill_attention_work = 0
    max_seq_len = 0
    pairs = [(num_scheduled_tokens[new.req_id], new.num_computed_tokens) for new in scheduler_output.scheduled_new_reqs]
    for request_id, context in zip(cached.req_ids, cached.num_computed_tokens):
        query = num_scheduled_tokens[request_id]
        if query == 1:
            num_decode_reqs += 1
            decode_context_tokens += context + 1
            if context >= max_seq_len:
                max_seq_len = context + 1
        else:
            pairs.append((query, context))
    for query, context in pairs:
        if query == 1:
            num_decode_reqs += 1
            decode_context_tokens += context + 1
        else:
            num_prefill_reqs += 1
            num_prefill_tokens += query
            prefill_context_tokens += context
            prefill_attention_work += query * context + query * (query + 1) // 2
        if context + query > max_seq_len:
            max_seq_len = context + query
    return StepFeatures(
        num_reqs=len(num_scheduled_tokens), num_tokens=scheduler_output.total_num_scheduled_tokens,
        num_prefill_reqs=num_prefill_reqs, num_prefill_tokens=num_prefill_tokens, num_decode_reqs=num_decode_reqs,
        decode_context_tokens=decode_context_tokens, prefill_context_tokens=prefill_context_tokens,
        prefill_attention_work=prefill_attention_work, max_seq_len=max_seq_len)
