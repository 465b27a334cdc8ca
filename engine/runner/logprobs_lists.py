"""Logprobs as plain Python values, the payload the runner hands the front end per request and step.

The sampler's tensors cover the whole batch padded to the largest k asked for; the runner converts
them with one ``tolist()`` per step (one device sync) and slices each request's own ``1 + k`` columns.
"""

from __future__ import annotations

from typing import NamedTuple

from engine.runner.sampler import LogprobsTensors


class TokenLogprobs(NamedTuple):
    """One generated position: column 0 is the sampled token, then the top-k tokens, best first."""
    token_ids: list[int]
    logprobs: list[float]
    sampled_rank: int  # 1 = the most likely token under the model's raw distribution


def token_logprobs_rows(tensors: LogprobsTensors, num_logprobs: int) -> list[TokenLogprobs]:
    """One TokenLogprobs per row of ``tensors`` (one request's positions, each with ``num_logprobs``)."""
    return [TokenLogprobs(ids[:1 + num_logprobs], values[:1 + num_logprobs], rank) for ids, values, rank in
            zip(tensors.logprob_token_ids.tolist(), tensors.logprobs.tolist(), tensors.selected_token_ranks.tolist())]


def split_logprobs(tensors: LogprobsTensors, num_logprobs: list[int | None],
                   req_ids: list[str]) -> dict[str, TokenLogprobs]:
    """{req_id: its TokenLogprobs} for the rows that asked for logprobs (row i belongs to req_ids[i])."""
    token_ids = tensors.logprob_token_ids.tolist()
    logprobs = tensors.logprobs.tolist()
    ranks = tensors.selected_token_ranks.tolist()
    out = {}
    for row, k in enumerate(num_logprobs):
        if k is not None:
            out[req_ids[row]] = TokenLogprobs(token_ids[row][:1 + k], logprobs[row][:1 + k], ranks[row])
    return out
