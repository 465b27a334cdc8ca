"""Prompt logprobs: for each prompt position p >= 1, how likely the model found prompt token p.

Computed from the hidden states of the prefill chunks (position p - 1 predicts token p), so only rows
still inside their prompt and asking for them pay anything. A prompt may be prefilled over several
chunks (and, after a preemption, from scratch again): the collector accumulates per request and
hands the complete list over exactly once, in the step whose chunk finishes the prompt.
The first prompt token has no logprob (nothing precedes it); consumers represent it as None.
"""

from __future__ import annotations

import numpy as np
import torch

from engine.runner.logprobs_lists import TokenLogprobs
from engine.runner.prepare_inputs import PreparedInputs
from engine.runner.request_state import CachedRequestState


class PromptLogprobsCollector:
    def __init__(self) -> None:
        self._in_progress: dict[str, list[TokenLogprobs]] = {}
        self._delivered: set[str] = set()

    def forget(self, req_id: str) -> None:
        self._in_progress.pop(req_id, None)
        self._delivered.discard(req_id)

    def collect(self, states: list[CachedRequestState], prepared: PreparedInputs, hidden_states: torch.Tensor,
                compute_logits) -> dict[str, list[TokenLogprobs]]:
        """Add this step's positions; return {req_id: all prompt logprobs} for prompts completed now."""
        common = prepared.common
        finished: dict[str, list[TokenLogprobs]] = {}
        for row, state in enumerate(states):
            k = state.sampling_params.prompt_logprobs
            if k is None or state.req_id in self._delivered or not common.is_prefilling[row]:
                continue
            start = int(common.num_computed_tokens[row])
            if start == 0:
                self._in_progress[state.req_id] = []  # a fresh (or recomputed after preemption) prefill
            num_prompt = state.num_prompt_tokens
            end = min(int(common.seq_lens[row]), num_prompt)
            # Positions start .. end - 1 predict tokens start + 1 .. end; the last prompt token predicts
            # an output token, which is not a prompt logprob.
            num_targets = min(end, num_prompt - 1) - start
            collected = self._in_progress.setdefault(state.req_id, [])
            if num_targets > 0:
                first = int(common.query_start_loc[row])
                targets = torch.tensor(state.prompt_token_ids[start + 1:start + 1 + num_targets],
                                       device=hidden_states.device)
                logits = compute_logits(hidden_states[first:first + num_targets]).to(torch.float32)
                collected.extend(_token_logprobs(logits.log_softmax(dim=-1), targets, k))
            if end == num_prompt:
                finished[state.req_id] = self._in_progress.pop(state.req_id)
                self._delivered.add(state.req_id)
        return finished


def _token_logprobs(logprobs: torch.Tensor, targets: torch.Tensor, k: int) -> list[TokenLogprobs]:
    target_logprobs = logprobs.gather(-1, targets[:, None])
    ranks = ((logprobs > target_logprobs).sum(dim=-1) + 1).tolist()  # ties: see sampler/logprobs.py
    token_ids, values = targets[:, None], target_logprobs
    if k > 0:
        top_values, top_ids = logprobs.topk(k, dim=-1)
        token_ids = torch.cat([token_ids, top_ids], dim=1)
        values = torch.cat([values, top_values], dim=1)
    return [TokenLogprobs(ids, vals, rank)
            for ids, vals, rank in zip(token_ids.tolist(), values.tolist(), ranks)]


def any_prompt_logprobs(states: list[CachedRequestState], is_prefilling: np.ndarray) -> bool:
    return any(state.sampling_params.prompt_logprobs is not None and prefilling
               for state, prefilling in zip(states, is_prefilling))
