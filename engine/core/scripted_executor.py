"""A model-free executor for tests and benchmarks of the core.

It keeps the same per-request state a real runner keeps (token ids, computed counts, block tables),
rebuilt only from ``SchedulerOutput``s, and checks on every step that what the scheduler sent is
consistent: positions continue where the last step stopped, and block tables cover every slot written.
Tokens are a deterministic function of the sequence so far (like a greedy model), so a preempted and
recomputed request produces exactly the tokens it would have produced without preemption.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

from engine.core.outputs import ModelRunnerOutput
from engine.core.scheduler_output import SchedulerOutput


class ExecutorStateError(AssertionError):
    """The scheduler sent the runner something inconsistent."""


@dataclass(slots=True)
class _RequestState:
    token_ids: list[int]
    num_computed_tokens: int
    block_ids: list[int]
    eos_token_id: int | None
    salt: int = 0


@dataclass
class ScriptedExecutor:
    vocab_size: int = 32000
    seed: int = 0
    # Probability that the next token is EOS (for requests that carry an eos_token_id).
    eos_probability: float = 0.0
    block_size: int = 16
    validate: bool = True
    states: dict[str, _RequestState] = field(default_factory=dict)
    num_steps: int = 0
    # The slots whose KV this executor has computed since their block was last (re)allocated, so that
    # tests can check every prefix-cached block really holds computed KV.
    computed_slots: dict[int, set[int]] = field(default_factory=dict)

    def next_token(self, state: _RequestState) -> int:
        """A hash of (seed, request salt, position, last token): same history, same token."""
        position = len(state.token_ids)
        mixed = (state.salt * 0x9E3779B1 + position * 0x85EBCA77 + state.token_ids[-1] * 0xC2B2AE3D
                 + self.seed) & 0xFFFFFFFF
        mixed = (mixed ^ (mixed >> 15)) * 0x2C1B3C6D & 0xFFFFFFFF
        mixed ^= mixed >> 13
        if state.eos_token_id is not None and self.eos_probability > 0.0:
            if (mixed % 10_000) < self.eos_probability * 10_000:
                return state.eos_token_id
        return mixed % self.vocab_size

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        self.num_steps += 1
        states = self.states
        for block_id in scheduler_output.new_block_ids_to_zero:
            self.computed_slots[block_id] = set()
        for request_id in scheduler_output.finished_req_ids:
            states.pop(request_id, None)
        for new_request in scheduler_output.scheduled_new_reqs:
            states[new_request.req_id] = _RequestState(
                list(new_request.prompt_token_ids), new_request.num_computed_tokens, list(new_request.block_ids),
                new_request.eos_token_id, zlib.crc32(new_request.req_id.encode()))
        cached = scheduler_output.scheduled_cached_reqs
        for index, request_id in enumerate(cached.req_ids):
            state = states.get(request_id)
            if state is None:
                raise ExecutorStateError(f"cached request {request_id} was never sent as new")
            if cached.resumed_from_preemption[index]:
                state.block_ids = list(cached.new_block_ids[index])
                state.token_ids = list(cached.resumed_token_ids[request_id])
            elif cached.new_block_ids[index]:
                state.block_ids.extend(cached.new_block_ids[index])
            if self.validate and cached.num_computed_tokens[index] != state.num_computed_tokens and \
                    not cached.resumed_from_preemption[index]:
                raise ExecutorStateError(
                    f"{request_id}: scheduler says {cached.num_computed_tokens[index]} computed tokens, "
                    f"runner has {state.num_computed_tokens}")
            state.num_computed_tokens = cached.num_computed_tokens[index]

        req_ids = list(scheduler_output.num_scheduled_tokens)
        sampled: list[list[int]] = []
        block_size = self.block_size
        for request_id in req_ids:
            state = states[request_id]
            num_scheduled = scheduler_output.num_scheduled_tokens[request_id]
            end = state.num_computed_tokens + num_scheduled
            if self.validate:
                if end > len(state.token_ids):
                    raise ExecutorStateError(f"{request_id}: scheduled past its known tokens")
                if len(state.block_ids) * block_size < end:
                    raise ExecutorStateError(f"{request_id}: {len(state.block_ids)} blocks cannot hold {end} tokens")
            for position in range(end - num_scheduled, end):
                block_id = state.block_ids[position // block_size]
                self.computed_slots.setdefault(block_id, set()).add(position % block_size)
            state.num_computed_tokens = end
            if end == len(state.token_ids):
                token = self.next_token(state)
                state.token_ids.append(token)
                sampled.append([token])
            else:
                sampled.append([])
        return ModelRunnerOutput(req_ids, {request_id: index for index, request_id in enumerate(req_ids)}, sampled)
