"""The simulator's executor: the cost model answers how long the step takes; every request gets a token.

Requests run with ``ignore_eos`` and ``max_tokens`` equal to the workload's output length, so the
token's value never decides when a request stops: the scheduler's own stop check ends each request at
exactly its output length. One shared output (the same token for every request) keeps the executor's
cost O(1) per step; the scheduler ignores tokens "sampled" for incomplete prefill chunks, as it does
for the real runner.

The exception is requests with the same prompt: the completions of one prompt (``workload.n``), and
any requests whose prompts repeat one another (a trace's repeated hash ids, a shared prefix that is the
whole prompt). With one shared token their outputs would be alike too, so a preempted request would
recompute its output from the others' cached blocks, which the real engine's requests (sampling
different tokens) never share. The k-th request with a prompt seen before therefore samples
``token_id + k`` (``add_prompt``); a request whose prompt is unique keeps ``token_id``.
"""

from __future__ import annotations

from array import array

from engine.core.outputs import ModelRunnerOutput
from engine.core.scheduler_output import SchedulerOutput
from sim.cost_models import CostModel, StepFeatures
from sim.lora_steps import LoRASteps
from sim.scheduled_batch import scheduler_output_features, step_batch


class SimulatedExecutor:
    def __init__(self, cost_model: CostModel, token_id: int = 0) -> None:
        self.cost_model = cost_model
        self.token_id = token_id
        self._time_features = getattr(cost_model, "step_time_from_features", None)
        self._sampled = [[token_id]]
        # The requests that sample another token than token_id (row token - token_id of _sampled).
        self.token_ids_by_request: dict[str, int] = {}
        # How many requests had each prompt so far, by the hash of its bytes: a collision only gives a
        # request with a unique prompt a token of its own, which no other request's blocks can match.
        self._num_requests_by_prompt_hash: dict[int, int] = {}
        self.last_duration = 0.0
        # Set by a pipelined engine loop (sim/pipeline_stages.py): each step is then timed stage by stage
        # (last_stage_times, after the engine's own last_overhead), once, and last_duration is their sum.
        self.time_by_stage = False
        self.last_overhead = 0.0
        self.last_stage_times: list[float] = []
        self.last_features: StepFeatures | None = None
        # Multi-LoRA serving (sim/lora_steps.py): the adapters' slots, and each step's adapter counts and loads.
        self.lora: LoRASteps | None = None

    def add_prompt(self, request_id: str, prompt_token_ids: array) -> None:
        """Note a request's prompt before it is added: the k-th request (k > 0) with a prompt seen before
        samples ``token_id + k``, so that no two requests with one prompt produce the same output."""
        key = hash(prompt_token_ids.tobytes())
        num_earlier = self._num_requests_by_prompt_hash.get(key, 0)
        self._num_requests_by_prompt_hash[key] = num_earlier + 1
        if num_earlier:
            self.sample_own_token(request_id, num_earlier)

    def sample_own_token(self, request_id: str, index: int) -> None:
        """The request samples ``token_id + index`` (index > 0) instead of the shared token."""
        while len(self._sampled) <= index:
            self._sampled.append([self.token_id + len(self._sampled)])
        self.token_ids_by_request[request_id] = self.token_id + index

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
        elif self.lora is not None:
            # The batch's adapters not on the device load first, synchronously, as vLLM's worker loads them.
            load_s = self.lora.on_step(scheduler_output, features)
            self.last_duration = self.cost_model_time(features) + load_s
        elif self.time_by_stage:
            cost_model = self.cost_model
            self.last_overhead = cost_model.engine_overhead_s(features)
            self.last_stage_times = cost_model.pipeline_stage_times(features)
            self.last_duration = self.last_overhead + sum(self.last_stage_times)
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
