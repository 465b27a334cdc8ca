"""``EngineCore.step()``: schedule -> execute -> update (the seed's section 5), over any executor.

The real model runner and the simulator both plug in as an ``Executor``; the scheduler and the
KV-cache manager are the same objects in both cases, which is what makes a simulated run comparable
to a real one step for step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol, runtime_checkable

from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.outputs import EngineCoreOutput, ModelRunnerOutput
from engine.core.request import Request, RequestStatus
from engine.core.scheduler import Scheduler
from engine.core.scheduler_output import SchedulerOutput


@runtime_checkable
class Executor(Protocol):
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step for the scheduled tokens and return the sampled tokens.

        Must accept an empty step (no tokens scheduled): it still carries finished request ids.
        """
        ...


@dataclass(slots=True)
class StartedStep:
    """A batch scheduled and handed to the executor, whose outputs the scheduler has not applied yet."""
    scheduler_output: SchedulerOutput
    model_runner_output: ModelRunnerOutput


@dataclass(slots=True)
class EngineStepResult:
    outputs: list[EngineCoreOutput]
    scheduler_output: SchedulerOutput | None   # None when there was nothing to schedule
    # What the executor returned for it (drivers that record a step's drafts read it); None as above.
    model_runner_output: ModelRunnerOutput | None = None


class EngineCore:
    def __init__(self, scheduler: Scheduler, executor: Executor) -> None:
        self.scheduler = scheduler
        self.executor = executor

    @classmethod
    def from_config(cls, scheduler_config: SchedulerConfig, cache_config: CacheConfig,
                    executor: Executor) -> "EngineCore":
        return cls(Scheduler(scheduler_config, cache_config), executor)

    def add_request(self, request: Request) -> None:
        self.scheduler.add_request(request)

    def abort_requests(self, request_ids: str | Iterable[str]) -> None:
        self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def has_work(self) -> bool:
        """True while a step would do something: requests to run, or outputs still to report."""
        return self.scheduler.has_unfinished_requests() or self.scheduler.has_pending_outputs()

    def step(self) -> EngineStepResult:
        scheduler = self.scheduler
        if not scheduler.has_unfinished_requests():
            return EngineStepResult(scheduler.take_pending_outputs(), None)
        # start_step + finish_step, without the StartedStep between them (this runs for every simulated step).
        scheduler_output = scheduler.schedule()
        try:
            model_runner_output = self.executor.execute_model(scheduler_output)
        except BaseException:
            _forget_copies_not_made(scheduler, scheduler_output)
            raise
        return EngineStepResult(scheduler.update_from_output(scheduler_output, model_runner_output), scheduler_output,
                                model_runner_output)

    # A step in two halves, for a driver that keeps several batches in flight (vLLM's batch queue under
    # pipeline parallelism, engine/core/batches_in_flight.py): it may start further steps before finishing
    # this one, and finishes them in the order it started them.
    def start_step(self) -> StartedStep:
        scheduler_output = self.scheduler.schedule()
        try:
            return StartedStep(scheduler_output, self.executor.execute_model(scheduler_output))
        except BaseException:
            _forget_copies_not_made(self.scheduler, scheduler_output)
            raise

    def finish_step(self, started: StartedStep) -> list[EngineCoreOutput]:
        return self.scheduler.update_from_output(started.scheduler_output, started.model_runner_output)


def _forget_copies_not_made(scheduler: Scheduler, scheduler_output: SchedulerOutput) -> None:
    """The executor failed (or was interrupted) on a step whose copies to the host tier it may not have made:
    the tier must not list KV it may not hold (engine/core/kv_offload.py)."""
    if scheduler_output.offload_stores:
        scheduler.kv_cache_manager.offload.forget_slots([slot for _, slot in scheduler_output.offload_stores])
