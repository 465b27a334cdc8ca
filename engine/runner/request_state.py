"""What the runner remembers about one request for its whole life (vLLM's ``CachedRequestState``).

A request leaves the persistent batch whenever it is not scheduled (preempted, or skipped because the
token budget ran out) but its state stays here until the scheduler reports it finished, so that it
can rejoin the batch later without the scheduler resending its tokens, and so that a seeded request
keeps drawing from the same generator (its random stream must not depend on batch composition).

Invariants: ``output_token_ids`` is mutated in place only (sampling metadata holds references to it);
``len(block_ids) * block_size >= num_computed_tokens`` (with a hybrid KV cache ``block_ids`` is a tuple of one list
per group, each that long).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.core.lora import LoRARequest
from engine.core.multimodal import MultiModalFeature
from engine.core.pooling_params import PoolingParams
from engine.core.sampling_params import SamplingParams
from engine.runner.structured_output.request_grammar import RequestGrammar


@dataclass(slots=True, eq=False)
class CachedRequestState:
    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    # Created once from SamplingParams.seed when the request first arrives; None for unseeded rows.
    generator: torch.Generator | None
    block_ids: list[int]
    num_computed_tokens: int
    output_token_ids: list[int]
    eos_token_id: int | None = None
    bad_words_token_ids: list[list[int]] | None = None
    # The request's grammar matcher when it asks for structured outputs (engine/runner/structured_output/); it lives
    # and dies with this state, and follows output_token_ids through truncations and preemptions.
    grammar: RequestGrammar | None = None
    # The LoRA adapter it runs with (None: the base model); sent once, when the request is first scheduled.
    lora_request: LoRARequest | None = None
    # An embedding request's pooling (engine/runner/pooler.py); None for generation. It gets no sampled token.
    pooling_params: PoolingParams | None = None
    # Its images (engine/core/multimodal.py), with their pixels: the encoder runs on them when the scheduler says.
    mm_features: tuple[MultiModalFeature, ...] = ()
    # M-RoPE models (engine/runner/mrope_positions.py), for a request with images: its prompt's [3, prompt tokens]
    # positions, and what every later token adds to its index. None and 0 otherwise.
    mrope_positions: np.ndarray | None = None
    mrope_delta: int = 0

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)


def copy_block_ids(block_ids):
    """A request's block ids as the scheduler sent them, copied to extend: a list, or a tuple of one list per
    group of a hybrid KV cache (kept as a tuple of lists)."""
    if isinstance(block_ids, tuple):
        return tuple(list(group) for group in block_ids)
    return list(block_ids)


def extend_block_ids(block_ids, new_block_ids) -> None:
    if isinstance(block_ids, tuple):
        for group, new in zip(block_ids, new_block_ids, strict=True):
            group.extend(new)
    else:
        block_ids.extend(new_block_ids)
