"""The real executor: the core's ``Executor`` protocol answered by a ModelRunner in this process.

Besides delegating ``execute_model``, it keeps what the core does not pass on: prompt logprobs (the
core's ``update_from_output`` forwards only sample logprobs) and pooled vectors of embedding requests,
held here until the front end takes them.
"""

from __future__ import annotations

from typing import Any

from engine.core.outputs import ModelRunnerOutput
from engine.core.scheduler_output import SchedulerOutput
from engine.runner.config import RunnerConfig
from engine.runner.model_runner import ModelRunner


class RealExecutor:
    def __init__(self, model_runner: ModelRunner) -> None:
        self.model_runner = model_runner
        self._prompt_logprobs: dict[str, Any] = {}
        self._pooler_output: dict[str, list[float]] = {}

    @classmethod
    def from_config(cls, config: RunnerConfig, tokenizer=None) -> "RealExecutor":
        return cls(ModelRunner(config, tokenizer=tokenizer))

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        output = self.model_runner.execute_model(scheduler_output)
        if output.prompt_logprobs:
            self._prompt_logprobs.update(output.prompt_logprobs)
        if output.pooler_output:
            self._pooler_output.update(output.pooler_output)
        # Finished requests can no longer claim theirs.
        for req_id in scheduler_output.finished_req_ids:
            self._prompt_logprobs.pop(req_id, None)
            self._pooler_output.pop(req_id, None)
        return output

    def take_prompt_logprobs(self, req_id: str) -> Any:
        """The request's prompt logprobs (list of TokenLogprobs, one per prompt token after the first)."""
        return self._prompt_logprobs.pop(req_id, None)

    def take_pooler_output(self, req_id: str) -> list[float] | None:
        """An embedding request's pooled vector, once its prompt has completed (then None)."""
        return self._pooler_output.pop(req_id, None)

    @property
    def last_step_duration_s(self) -> float:
        return self.model_runner.last_step_duration_s
