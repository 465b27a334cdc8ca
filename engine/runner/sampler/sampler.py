"""The sampler: logits [N, vocab] + SamplingMetadata -> one token per row (and logprobs if asked).

Order (vLLM V1's): logprobs of the raw logits; logits to float32; allowed tokens, bad words,
min_tokens, logit bias; penalties; then argmax for an all-greedy batch, otherwise temperature, min-p,
top-k, top-p and a random draw, with greedy rows of a mixed batch taking the argmax of the processed
(untempered) logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from engine.runner.sampler.logits_processors import (apply_allowed_token_ids, apply_bad_words,
                                                     apply_logit_bias, apply_min_tokens)
from engine.runner.sampler.logprobs import LogprobsTensors, gather_logprobs
from engine.runner.sampler.metadata import SamplingMetadata
from engine.runner.sampler.penalties import apply_penalties
from engine.runner.sampler.topk_topp import sample_random


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # [N] int64
    logprobs: LogprobsTensors | None


class Sampler(nn.Module):
    def forward(self, logits: torch.Tensor, metadata: SamplingMetadata) -> SamplerOutput:
        if logits.shape[0] != metadata.num_reqs:
            raise ValueError(f"logits have {logits.shape[0]} rows, sampling metadata {metadata.num_reqs}")
        raw_logprobs = None
        if metadata.max_num_logprobs is not None:
            # Raw: what the model said, before any request-level processing changed the distribution.
            raw_logprobs = logits.to(torch.float32).log_softmax(dim=-1)

        # A private float32 copy: every stage below works in place, and the caller's logits stay intact.
        logits = logits.to(torch.float32, copy=True)
        logits = self.apply_logits_processors(logits, metadata)
        sampled = self.sample(logits, metadata)

        logprobs = None
        if raw_logprobs is not None:
            logprobs = gather_logprobs(raw_logprobs, metadata.max_num_logprobs, sampled)
        return SamplerOutput(sampled_token_ids=sampled, logprobs=logprobs)

    @staticmethod
    def apply_logits_processors(logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        apply_allowed_token_ids(logits, metadata)
        apply_bad_words(logits, metadata)
        apply_min_tokens(logits, metadata)
        apply_logit_bias(logits, metadata)
        apply_penalties(logits, metadata)
        return logits

    @staticmethod
    def sample(logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        greedy = None if metadata.all_random else logits.argmax(dim=-1)
        if metadata.all_greedy:
            return greedy
        sampled = sample_random(logits, metadata)  # modifies logits; greedy was taken before
        if greedy is None:
            return sampled
        return torch.where(metadata.is_greedy, greedy, sampled)
