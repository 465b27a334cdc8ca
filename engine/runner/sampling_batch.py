"""SamplingMetadata for the rows that sample in a step, reused while those rows do not change.

In steady decoding the same requests sample step after step, and most of the metadata (temperatures,
truncation knobs, masks, generators) depends only on which requests they are. The metadata holds
references to each request's ``output_token_ids`` list, which the runner appends to in place, so a
cached metadata stays current as long as the sampling rows are the same requests in the same order.
The one exception is the penalty stage, which caches a tensor of output tokens: metadata with
penalties is rebuilt every step.
"""

from __future__ import annotations

import torch

from engine.runner.request_state import CachedRequestState
from engine.runner.sampler import SamplingMetadata


class SamplingMetadataCache:
    def __init__(self, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self._key: list[CachedRequestState] | None = None
        self._metadata: SamplingMetadata | None = None

    def get(self, states: list[CachedRequestState]) -> SamplingMetadata:
        """Metadata whose row i is ``states[i]``."""
        metadata = self._metadata
        if (metadata is not None and metadata.no_penalties and self._key is not None
                and len(self._key) == len(states) and all(a is b for a, b in zip(self._key, states))):
            return metadata
        metadata = build_sampling_metadata(states, self.vocab_size, self.device)
        self._key, self._metadata = states, metadata
        return metadata

    def clear(self) -> None:
        self._key = self._metadata = None


def build_sampling_metadata(states: list[CachedRequestState], vocab_size: int,
                            device: torch.device) -> SamplingMetadata:
    params = [state.sampling_params for state in states]
    needs_prompts = any(p.repetition_penalty != 1.0 for p in params)
    bad_words = [state.bad_words_token_ids for state in states]
    eos_ids = sorted({state.eos_token_id for state in states if state.eos_token_id is not None})
    return SamplingMetadata.from_requests(
        params,
        [state.output_token_ids for state in states],
        prompt_token_ids=[state.prompt_token_ids for state in states] if needs_prompts else None,
        generators={row: state.generator for row, state in enumerate(states) if state.generator is not None},
        bad_words_token_ids=bad_words if any(bad_words) else None,
        eos_token_id=eos_ids or None,
        vocab_size=vocab_size,
        device=device,
    )
