"""The simulated executor of an engine that speculates (``engine.speculative_decoding``).

It answers what a real runner would, in the shape the core expects (engine/core/spec_decode.py): for a
request scheduled with drafts, the accepted drafts then one more token (how many drawn by
sim/speculation.py); for every request that sampled, ``num_speculative_tokens`` drafts for its next step
(the core trims them to what the request may still produce). Token values follow the simulator's shared
scheme (sim/sim_executor.py): a request samples its usual token at every position, drafts included, so a
speculating run produces exactly the tokens a plain one does, in fewer steps. The core never checks a
draft's value, only how many the executor kept.

The step's time is the target's pass, verification rows included (the cost model reads
``StepFeatures.num_spec_tokens``), plus proposing the next drafts (``proposer_seconds``).

A separate class so that the plain executor's per-step path stays as it is: the simulator's speed rests on it.
"""

from __future__ import annotations

from engine.core.outputs import ModelRunnerOutput
from engine.core.scheduler_output import SchedulerOutput
from sim.cost_models import CostModel
from sim.sim_executor import SimulatedExecutor
from sim.speculation import AcceptanceDraws, ProposalDraws, SpeculationSetup, proposer_seconds


class SpeculatingExecutor(SimulatedExecutor):
    def __init__(self, cost_model: CostModel, speculation: SpeculationSetup, token_id: int = 0) -> None:
        super().__init__(cost_model, token_id)
        if speculation.num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens: a speculating executor needs at least 1, got "
                             f"{speculation.num_speculative_tokens}")
        self.speculation = speculation
        self.acceptances = AcceptanceDraws(speculation)
        # How many drafts each proposal offers, when the proposer may offer fewer than all (an n-gram lookup).
        self.proposals = None if speculation.always_proposes_all else ProposalDraws(speculation)
        # One list of drafts per token value and length, shared by every request proposing it (the core copies).
        self._drafts_of_token: dict[tuple[int, int], list[int]] = {}
        # What proposing cost in the last step (part of last_duration), and for how many requests that sampled.
        self.last_proposer_s = 0.0
        self.last_num_sampling = 0

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        output = super().execute_model(scheduler_output)
        if scheduler_output.finished_req_ids:
            self.acceptances.forget(scheduler_output.finished_req_ids)
            if self.proposals is not None:
                self.proposals.forget(scheduler_output.finished_req_ids)
        self.last_proposer_s = 0.0
        self.last_num_sampling = 0
        if not scheduler_output.total_num_scheduled_tokens:
            return output
        rows = output.req_id_to_index
        sampled = output.sampled_token_ids  # the shared rows: copied before a step adds its own
        num_scheduled = scheduler_output.num_scheduled_tokens
        partial = scheduler_output.partial_prefill_req_ids
        spec = scheduler_output.scheduled_spec_decode_tokens
        own_tokens, shared_token = self.token_ids_by_request, self.token_id
        draws, drafts_of_token = self.acceptances, self._drafts_of_token
        num_speculative_tokens = self.speculation.num_speculative_tokens
        offers = self.proposals
        proposals: dict[str, list[int]] = {}
        # Rows of several tokens this step, by (token, count).
        multi_rows: dict[tuple[int, int], int] = {}
        sequence_tokens = longest = num_sampling = 0
        cached = scheduler_output.scheduled_cached_reqs
        scheduled = [(new.req_id, new.num_computed_tokens) for new in scheduler_output.scheduled_new_reqs]
        scheduled += zip(cached.req_ids, cached.num_computed_tokens)
        for request_id, num_computed in scheduled:
            if request_id in partial:
                continue  # a prompt chunk short of the end samples nothing, and proposes nothing
            token = own_tokens.get(request_id, shared_token)
            drafts = spec.get(request_id) if spec else None
            if drafts:
                # Its last token sits at num_computed, its first draft right after.
                accepted = draws.num_accepted(request_id, num_computed + 1, len(drafts))
                length = num_computed + accepted + 2
                if accepted:
                    row = multi_rows.get((token, accepted + 1))
                    if row is None:
                        if not multi_rows:
                            sampled = list(sampled)
                        row = multi_rows[(token, accepted + 1)] = len(sampled)
                        sampled.append([token] * (accepted + 1))
                    rows[request_id] = row
            else:
                length = num_computed + num_scheduled[request_id] + 1
            sequence_tokens += length
            if length > longest:
                longest = length
            num_sampling += 1
            # The next drafts would sit right after the sequence's last token.
            num_offered = num_speculative_tokens if offers is None else offers.num_offered(request_id, length)
            if not num_offered:
                continue  # the lookup found nothing: the request decodes one token next, as without speculation
            proposal = drafts_of_token.get((token, num_offered))
            if proposal is None:
                proposal = drafts_of_token[(token, num_offered)] = [token] * num_offered
            proposals[request_id] = proposal
        self.last_num_sampling = num_sampling
        self.last_proposer_s = proposer_seconds(self.speculation, self.last_features, num_sampling,
                                                sequence_tokens, longest)
        self.last_duration += self.last_proposer_s
        return ModelRunnerOutput(output.req_ids, rows, sampled, spec_token_ids=proposals)


def make_executor(cost_model: CostModel, speculation: SpeculationSetup | None) -> SimulatedExecutor:
    """The executor of one simulated engine: a speculating one when ``speculation`` is set."""
    return SimulatedExecutor(cost_model) if speculation is None else SpeculatingExecutor(cost_model, speculation)
