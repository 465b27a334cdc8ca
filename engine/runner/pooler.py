"""Pooling: one vector per embedding request from its prompt's final hidden states (vLLM's Pooler).

The model's forward returns the hidden states after the final norm, before the LM head: those are
pooled. A prompt may be prefilled over several chunks (and, after a preemption, from scratch again), so
the collector keeps what each request's pooling type needs across steps, as the prompt-logprobs
collector does: MEAN a float32 running sum of its rows, CLS the first position's row, LAST nothing until
the chunk that holds the last prompt position. It hands the vector over once, in the step whose chunk
completes the prompt. Positions a prefix-cache hit skipped are never computed: MEAN and CLS requests skip
reading the cache (``PoolingParams.skip_reading_prefix_cache``), LAST needs only the last position, which
every request computes.

Post-processing, in vLLM's order: keep the first ``dimensions`` components (Matryoshka), then L2-normalize
when asked, so a truncated vector is renormalized. A sequence classifier's pooled state goes through its score
head instead (``head``: the hidden state -> the labels' probabilities); what the request gets is those.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from engine.core.pooling_params import PoolingParams
from engine.runner.input_batch import InputBatch
from engine.runner.prepare_inputs import PreparedInputs
from engine.runner.request_state import CachedRequestState


class PoolingCollector:
    def __init__(self, head: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        # req_id -> the partial pooled state (MEAN: [sum of rows, count]; CLS: [first row]).
        self._in_progress: dict[str, list] = {}
        self.head = head

    def forget(self, req_id: str) -> None:
        self._in_progress.pop(req_id, None)

    def collect(self, states: list[CachedRequestState], prepared: PreparedInputs,
                hidden_states: torch.Tensor) -> dict[str, list[float]]:
        """Take this step's rows of pooling requests; return {req_id: pooled vector} for prompts completed now."""
        common = prepared.common
        finished: dict[str, list[float]] = {}
        for row, state in enumerate(states):
            params = state.pooling_params
            if params is None or not common.is_prefilling[row]:
                continue
            start = int(common.num_computed_tokens[row])
            num_prompt = state.num_prompt_tokens
            end = min(int(common.seq_lens[row]), num_prompt)
            first = int(common.query_start_loc[row])
            rows = hidden_states[first:first + end - start]
            pooling_type = params.pooling_type or "LAST"
            if pooling_type == "MEAN":
                if start == 0:  # a fresh (or recomputed after preemption) prefill
                    self._in_progress[state.req_id] = [0.0, 0]
                partial = self._in_progress.setdefault(state.req_id, [0.0, 0])
                partial[0] = partial[0] + rows.to(torch.float32).sum(dim=0)
                partial[1] += end - start
            elif pooling_type == "CLS" and start == 0:
                self._in_progress[state.req_id] = [rows[0].to(torch.float32)]
            if end < num_prompt:
                continue
            if pooling_type == "LAST":
                pooled = rows[-1].to(torch.float32)
            elif pooling_type == "MEAN":
                total, count = self._in_progress.pop(state.req_id)
                pooled = total / count
            else:
                pooled = self._in_progress.pop(state.req_id)[0]
            result = postprocess(pooled, params) if self.head is None else self.head(pooled).cpu()
            finished[state.req_id] = result.tolist()
        return finished


def postprocess(pooled: torch.Tensor, params: PoolingParams) -> torch.Tensor:
    """Truncate to ``dimensions`` (Matryoshka), then L2-normalize unless ``normalize`` is False."""
    if params.dimensions is not None:
        pooled = pooled[:params.dimensions]
    if params.normalize is not False:
        pooled = F.normalize(pooled, p=2, dim=-1)
    return pooled.cpu()


def any_pooling(states: list[CachedRequestState]) -> bool:
    return any(state.pooling_params is not None for state in states)


def give_placeholder_tokens(batch: InputBatch, states: list[CachedRequestState], sampled_rows: np.ndarray,
                            sampled_token_ids: list[list[int]]) -> np.ndarray:
    """Pooling rows among ``sampled_rows`` (their prompt completes now) get a placeholder token, not a sample: the
    LM head never runs for them; the token only lets the core end the request after its one allowed token, and
    the front end drops it. Returns the mask of those rows over ``sampled_rows``."""
    pooled = np.fromiter((states[row].pooling_params is not None for row in sampled_rows.tolist()), dtype=bool,
                         count=len(sampled_rows))
    for row in sampled_rows[pooled].tolist():
        state = states[row]
        token = state.eos_token_id if state.eos_token_id is not None else 0
        batch.append_row_token_ids(row, [token])
        state.output_token_ids.append(token)
        sampled_token_ids[row] = [token]
    return pooled
