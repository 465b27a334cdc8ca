"""The attention backend interface: write this step's K/V into the paged cache, then attend.

The order is part of the contract. Requests in one batch can share prefix blocks that are being
written in this very step (e.g. two prompts with a common prefix scheduled together after a
prefix-cache hit is registered), and every request's own new keys must be visible to its queries, so
all writes happen before any read.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from engine.runner.attention.metadata import AttentionMetadata
from kernels.reshape_and_cache import reshape_and_cache

KVCache = tuple[torch.Tensor, torch.Tensor]  # (key_cache, value_cache), each [num_blocks, block_size, Hkv, D]


class GroupKVCache(tuple):
    """A layer's (key_cache, value_cache) under a hybrid KV cache (engine/core/kv_cache_grouping.py), with the
    group whose block table addresses it: the tensors are the slot this layer shares with the layers at its
    place in the other groups, each group's blocks its own."""

    def __new__(cls, key_cache: torch.Tensor, value_cache: torch.Tensor, group: int) -> "GroupKVCache":
        pair = super().__new__(cls, (key_cache, value_cache))
        pair.group = group
        return pair


class AttentionBackend(ABC):
    name: str = "abstract"
    # Whether ``attend`` takes attention sinks (gpt-oss); forward refuses them by name otherwise.
    supports_sinks: bool = False
    # Whether the backend reads AttentionMetadata.bidirectional_spans (Gemma 3's images attended both ways).
    supports_bidirectional_spans: bool = False

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: KVCache | torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
        sliding_window: int | None = None,
        logits_soft_cap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """query [T, Hq, D], key/value [T, Hkv, D] -> output [T, Hq, D].

        ``kv_cache`` is a (key_cache, value_cache) pair or a tensor whose first dimension of size 2
        unbinds into one. Rows at or past ``metadata.num_actual_tokens`` are padding: their output is 0.
        ``sliding_window`` (a layer's window, None for full attention): a query at position ``p`` attends
        keys ``max(0, p - sliding_window + 1) .. p`` only, ``sliding_window`` keys with itself, as
        transformers' and vLLM's sliding-window layers do. Keys before that are never read, so the core
        may have handed their blocks back (their block-table entries then point at the null block).
        ``logits_soft_cap`` (Gemma 2's ``attn_logit_softcapping``, None: none): each score ``s = scale * q.k``
        becomes ``cap * tanh(s / cap)`` before the mask and the softmax.
        ``sinks`` (gpt-oss: one learned logit per query head, [Hq], None: none): each head's softmax has one more
        term, ``exp(sink)``, in its denominator, attending no value: the head may give a token little attention
        in total.
        """
        if sinks is not None and not self.supports_sinks:
            raise ValueError(f"attention backend {self.name!r} does not support attention sinks (gpt-oss); use "
                             "attention_backend 'torch'")
        if metadata.groups is not None:  # a hybrid KV cache: this layer's group's block table and slots
            metadata = metadata.groups[kv_cache.group]
        key_cache, value_cache = kv_cache
        num_heads, num_kv_heads = query.shape[1], key.shape[1]
        if num_heads % num_kv_heads != 0:
            raise ValueError(f"{num_heads} query heads are not a multiple of {num_kv_heads} kv heads")
        self.write_kv_cache(key, value, key_cache, value_cache, metadata)
        output = torch.zeros_like(query)
        if metadata.num_actual_tokens > 0:
            self.attend(query, key_cache, value_cache, metadata, scale, output, sliding_window, logits_soft_cap,
                        sinks)
        return output

    def write_kv_cache(self, key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                       value_cache: torch.Tensor, metadata: AttentionMetadata) -> None:
        reshape_and_cache(key, value, key_cache, value_cache, metadata.slot_mapping)

    @abstractmethod
    def attend(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
               metadata: AttentionMetadata, scale: float, output: torch.Tensor,
               sliding_window: int | None = None, logits_soft_cap: float | None = None,
               sinks: torch.Tensor | None = None) -> None:
        """Fill ``output[:num_actual_tokens]`` reading keys and values only from the caches (and, with a
        ``sliding_window``, only the keys inside each query's window: see ``forward``)."""
