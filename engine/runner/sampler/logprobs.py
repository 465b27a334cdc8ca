"""Top-k logprobs plus the sampled token's logprob and rank, as one set of tensors for the batch."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LogprobsTensors:
    # Column 0 is the sampled token, columns 1..k the top-k tokens, most likely first. Rows asking for
    # fewer than the batch's max k use only their first 1 + k columns.
    logprob_token_ids: torch.Tensor  # [N, 1 + max_num_logprobs] int64
    logprobs: torch.Tensor  # [N, 1 + max_num_logprobs] float32
    selected_token_ranks: torch.Tensor  # [N] int64, 1 = the most likely token


def gather_logprobs(logprobs: torch.Tensor, num_logprobs: int, token_ids: torch.Tensor) -> LogprobsTensors:
    token_ids = token_ids.to(torch.long)[:, None]
    token_logprobs = logprobs.gather(-1, token_ids)
    # Rank counts strictly better tokens, so ties share the better rank. vLLM counts tokens at least as
    # likely (ties take the worse rank); the two differ only for a token tied with another.
    ranks = (logprobs > token_logprobs).sum(dim=-1) + 1
    if num_logprobs > 0:
        top_logprobs, top_ids = logprobs.topk(num_logprobs, dim=-1)
        token_ids = torch.cat([token_ids, top_ids], dim=1)
        token_logprobs = torch.cat([token_logprobs, top_logprobs], dim=1)
    return LogprobsTensors(token_ids, token_logprobs, ranks)
