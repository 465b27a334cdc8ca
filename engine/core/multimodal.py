"""Multimodal inputs as the scheduler sees them: items (images) whose encoder output fills placeholder tokens.

A vision-language model's prompt holds, for each image, a run of placeholder tokens; the image's encoder (a
ViT) turns it into exactly that many embeddings, which the decoder reads at those positions instead of the
placeholder token's embedding. The scheduler needs three facts per item, as vLLM's ``mm_features`` give them:
where its placeholders start, how many there are, and a content hash (``identifier``, vLLM's ``mm_hash``).

The identifier does two jobs. Equal identifiers mean the same image, so one encoder output serves every
request that shows it (engine/core/encoder_cache_manager.py). And it is an extra key of every KV block whose
tokens overlap the item's placeholders (engine/core/block_hash.py): two prompts with the same placeholder
tokens but different images must never share a cached block.

Invariants (checked by ``validate_features``): items are sorted by offset, do not overlap, have at least one
placeholder token and lie inside the prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence


@dataclass(frozen=True, slots=True)
class MultiModalFeature:
    # The item's content hash: equal identifiers share an encoder output and cached KV.
    identifier: str
    # The first prompt position of its placeholder tokens.
    offset: int
    # Its placeholder tokens, which is the number of embeddings its encoder output holds.
    length: int
    # The encoder's input (a real engine's processed pixels), carried to the runner; the core never reads it, and it
    # takes no part in equality: the identifier stands for the content. None in simulation.
    data: Any = field(default=None, compare=False, repr=False)

    @property
    def end(self) -> int:
        return self.offset + self.length


def validate_features(features: Sequence[MultiModalFeature], num_prompt_tokens: int,
                      request_id: str) -> tuple[MultiModalFeature, ...]:
    """The features as a tuple, or ValueError naming the request and the first bad item."""
    previous_end = 0
    for index, feature in enumerate(features):
        if not isinstance(feature, MultiModalFeature):
            raise ValueError(f"request {request_id!r}: mm_features[{index}] must be a MultiModalFeature, "
                             f"got {feature!r}")
        if not isinstance(feature.identifier, str) or not feature.identifier:
            raise ValueError(f"request {request_id!r}: mm_features[{index}].identifier must be a non-empty string, "
                             f"got {feature.identifier!r}")
        if feature.length < 1:
            raise ValueError(f"request {request_id!r}: mm_features[{index}].length must be >= 1, got {feature.length}")
        if feature.offset < previous_end:
            raise ValueError(f"request {request_id!r}: mm_features[{index}] starts at {feature.offset}, inside or "
                             f"before the item before it (which ends at {previous_end}); items are sorted and "
                             "do not overlap")
        if feature.end > num_prompt_tokens:
            raise ValueError(f"request {request_id!r}: mm_features[{index}] covers positions {feature.offset}-"
                             f"{feature.end - 1}, past the prompt's {num_prompt_tokens} tokens")
        previous_end = feature.end
    return tuple(features)


def overlapping_identifiers(features: Sequence[MultiModalFeature], start: int, end: int) -> list[str]:
    """The identifiers of the items whose placeholders overlap positions [start, end), in prompt order."""
    return [feature.identifier for feature in features if feature.offset < end and feature.end > start]


def encode_block_items(identifiers: Sequence[str]) -> bytes:
    """A block's multimodal extra key: the identifiers of the items its tokens overlap (empty if none)."""
    return b"mm:" + "\x1f".join(identifiers).encode("utf-8") if identifiers else b""
