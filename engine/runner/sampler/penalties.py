"""Repetition, frequency and presence penalties on float32 logits [N, vocab], in place.

Repetition (Hugging Face / CTRL semantics): for every token seen in the prompt or the output so far, a
positive logit is divided by the penalty and a negative one multiplied by it, so a penalty > 1 always
makes the token less likely. Frequency and presence (OpenAI semantics) look at the output only:
``logit -= frequency * count + presence * (count > 0)``.
"""

from __future__ import annotations

import torch

from engine.runner.sampler.metadata import SamplingMetadata


def token_counts(token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[N, L] ids padded with vocab_size -> [N, vocab] counts (the padding column is dropped)."""
    counts = torch.zeros(token_ids.shape[0], vocab_size + 1, dtype=torch.long, device=token_ids.device)
    counts.scatter_add_(1, token_ids, torch.ones_like(token_ids))
    return counts[:, :vocab_size]


def apply_penalties(logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
    if metadata.no_penalties:
        return logits
    vocab_size = logits.shape[1]
    output_counts = token_counts(metadata.output_token_tensor(), vocab_size)
    output_mask = output_counts > 0

    repetition = metadata.repetition_penalties[:, None]
    if metadata.prompt_token_ids is not None:
        seen = output_mask | (token_counts(metadata.prompt_token_ids, vocab_size) > 0)
        penalty = torch.where(seen, repetition, torch.ones_like(repetition))
        logits.copy_(torch.where(logits > 0, logits / penalty, logits * penalty))

    logits -= metadata.frequency_penalties[:, None] * output_counts.to(logits.dtype)
    logits -= metadata.presence_penalties[:, None] * output_mask.to(logits.dtype)
    return logits
