"""Replaying a speculating real run: the executor keeps and proposes as many drafts as the real runner did.

The real runner's acceptances come from the model (engine/runner/spec_decode/); a replay has no model, so it
reads them back from the run's step table (``sampled_token_counts`` and ``proposed_draft_counts``, recorded by
sim/wall_clock_driver.py): in the k-th step that schedules tokens, each request returns as many tokens, and
proposes as many drafts, as in the recorded k-th step. Token values follow the simulator's scheme
(sim/sim_executor.py); the core only counts drafts. If the replay's schedule differs from the recording's, the
counts no longer apply to it: the executor then stops answering from the recording, and ``compare_replay``
names the first step that differs.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.core.outputs import ModelRunnerOutput
from engine.core.scheduler_output import SchedulerOutput
from sim.cost_models import CostModel
from sim.sim_executor import SimulatedExecutor


class RecordedDraftsExecutor(SimulatedExecutor):
    def __init__(self, cost_model: CostModel, scheduled_request_ids: Sequence[Sequence[str]],
                 sampled_counts: Sequence[Sequence[int]], proposed_counts: Sequence[Sequence[int]]) -> None:
        super().__init__(cost_model)
        self._recorded = list(zip(scheduled_request_ids, sampled_counts, proposed_counts))
        self._step = 0

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        output = super().execute_model(scheduler_output)
        if not scheduler_output.total_num_scheduled_tokens or self._step >= len(self._recorded):
            return output
        request_ids, sampled_counts, proposed_counts = self._recorded[self._step]
        self._step += 1
        if list(request_ids) != list(scheduler_output.num_scheduled_tokens):
            self._recorded = self._recorded[:self._step - 1]  # diverged: the rest of the recording does not apply
            return output
        rows, sampled = dict(output.req_id_to_index), list(output.sampled_token_ids)
        own_tokens, proposals = self.token_ids_by_request, {}
        for request_id, num_sampled, num_proposed in zip(request_ids, sampled_counts, proposed_counts):
            token = own_tokens.get(request_id, self.token_id)
            if num_sampled > 1:
                rows[request_id] = len(sampled)
                sampled.append([token] * int(num_sampled))
            if num_proposed:
                proposals[request_id] = [token] * int(num_proposed)
        return ModelRunnerOutput(output.req_ids, rows, sampled, spec_token_ids=proposals)
