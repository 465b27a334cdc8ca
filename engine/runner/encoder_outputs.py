"""Images' encoder outputs on the runner's side (vLLM's encoder cache in its GPU model runner).

The scheduler decides (engine/core/encoder_cache_manager.py); the runner follows, once per step, before the forward:
1. drop the outputs the scheduler freed (``free_encoder_mm_hashes``);
2. encode the items it scheduled (``scheduled_encoder_inputs``: request id -> item indices), every image of the
   step in one batch, and keep each output under its identifier;
3. for every row whose chunk overlaps an item's placeholders, copy the overlapping slice of that item's output into
   those tokens' rows of the step's embeddings.

Invariant (the core's): a chunk that reaches an item's placeholders has the item's output kept, computed in this
step or earlier; a missing one is a broken promise, raised rather than run with the placeholder's own embedding.
"""

from __future__ import annotations

import numpy as np
import torch

from engine.core.scheduler_output import SchedulerOutput
from engine.runner.request_state import CachedRequestState


class EncoderOutputs:
    def __init__(self, encoder, device: torch.device) -> None:
        self.encoder = encoder
        self.device = device
        self.outputs: dict[str, torch.Tensor] = {}
        # Images encoded so far (a repeated image the scheduler kept is not encoded again).
        self.num_items_encoded = 0

    def update(self, scheduler_output: SchedulerOutput, requests: dict[str, CachedRequestState]) -> None:
        """Steps 1 and 2."""
        for identifier in scheduler_output.free_encoder_mm_hashes:
            self.outputs.pop(identifier, None)
        items = [requests[req_id].mm_features[index]
                 for req_id, indices in scheduler_output.scheduled_encoder_inputs.items() for index in indices]
        # The same image in two requests of one step is scheduled once by the core; encode each identifier once.
        items = list({feature.identifier: feature for feature in items}.values())
        if not items:
            return
        embeddings = self.encoder.encode([feature.data for feature in items])
        for feature, embedding in zip(items, embeddings):
            if embedding.shape[0] != feature.length:
                raise RuntimeError(f"image {feature.identifier[:12]} encodes to {embedding.shape[0]} embeddings but "
                                   f"holds {feature.length} placeholder tokens")
            self.outputs[feature.identifier] = embedding
        self.num_items_encoded += len(items)

    def placeholder_embeddings(self, states: list[CachedRequestState], num_computed: np.ndarray,
                               num_scheduled: np.ndarray) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Step 3's (flat token rows, the embeddings that go there) for the step's placeholder tokens, or None when
        no scheduled token is one (the forward then embeds the ids itself, and a decode step may replay a graph)."""
        rows: list[int] = []
        slices: list[torch.Tensor] = []
        start_of_row = np.concatenate(([0], np.cumsum(num_scheduled)))
        for row, state in enumerate(states):
            if not state.mm_features:
                continue
            first, end = int(num_computed[row]), int(num_computed[row] + num_scheduled[row])
            for feature in state.mm_features:
                if feature.offset >= end or feature.end <= first:
                    continue
                output = self.outputs.get(feature.identifier)
                if output is None:
                    raise RuntimeError(f"request {state.req_id!r}: the step reaches image {feature.identifier[:12]} "
                                       "but its encoder output was neither kept nor scheduled")
                low, high = max(first, feature.offset), min(end, feature.end)
                flat = int(start_of_row[row]) + low - first
                rows.extend(range(flat, flat + high - low))
                slices.append(output[low - feature.offset:high - feature.offset])
        if not rows:
            return None
        return torch.tensor(rows, dtype=torch.long, device=self.device), torch.cat(slices)


def fill_placeholders(token_embeddings: torch.Tensor, placeholders: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The step's token embeddings with its placeholder rows replaced by their images' embeddings (the first
    hidden-size features of each output: Qwen3-VL's DeepStack levels follow them, ``deepstack_inputs``)."""
    rows, embeddings = placeholders
    token_embeddings[rows] = embeddings[:, :token_embeddings.shape[1]].to(token_embeddings.dtype)
    return token_embeddings


def deepstack_inputs(placeholders: tuple[torch.Tensor, torch.Tensor],
                     hidden_size: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(the placeholder rows, [levels, rows, hidden] each level's embeddings) for an encoder whose outputs carry
    DeepStack levels after the placeholder's embedding (Qwen3-VL: the language model adds level i to those rows'
    hidden states after its layer i); None for outputs of the hidden size alone."""
    rows, embeddings = placeholders
    if embeddings.shape[1] == hidden_size:
        return None
    if embeddings.shape[1] % hidden_size:
        raise RuntimeError(f"image encoder outputs of {embeddings.shape[1]} features are not whole embeddings of the "
                           f"language model's {hidden_size}")
    return rows, embeddings[:, hidden_size:].unflatten(1, (-1, hidden_size)).transpose(0, 1)


def bidirectional_spans(states: list[CachedRequestState], num_computed: np.ndarray,
                        num_scheduled: np.ndarray) -> list[tuple[tuple[int, int], ...]]:
    """Per row, the [offset, end) of each image its chunk computes: AttentionMetadata.bidirectional_spans, for a
    model whose image tokens attend each other both ways (Gemma 3)."""
    spans = []
    for row, state in enumerate(states):
        first, end = int(num_computed[row]), int(num_computed[row] + num_scheduled[row])
        spans.append(tuple((feature.offset, feature.end) for feature in state.mm_features
                           if feature.offset < end and feature.end > first))
    return spans
