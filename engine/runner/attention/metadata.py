"""Attention metadata: what every attention backend needs to know about one step's batch.

The batch is flat: the scheduled tokens of all requests are concatenated, request ``i`` owning tokens
``query_start_loc[i]:query_start_loc[i+1]``. Request ``i`` has ``seq_lens[i]`` tokens in total after this
step (``num_computed_tokens + num_scheduled_tokens``); its new tokens are the last ``query_len`` of them,
so a query token at offset ``j`` sits at position ``seq_len - query_len + j`` and may attend keys
``0 .. seq_len - query_len + j``.

Device tensors serve the kernels; the ``*_cpu`` lists serve Python loops without a device sync.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch

from engine.runner.attention.decode_groups import DecodeGroup, make_decode_groups


@dataclass
class DecodePrefillSplit:
    """Requests partitioned by query length, computed once per step and reused by every layer.

    A request with exactly one query token (a decode, or a prefill that hit the prefix cache up to its
    last token) attends like a decode: no causal structure inside the query. Those are batched together.
    """

    decode_req_indices: list[int]
    prefill_req_indices: list[int]
    decode_req_index_tensor: torch.Tensor  # [num_decodes] int64, on the metadata's device
    decode_token_index_tensor: torch.Tensor  # [num_decodes] int64: row of each decode's query token
    decode_seq_lens: torch.Tensor  # [num_decodes] int64
    max_decode_seq_len: int


@dataclass
class AttentionMetadata:
    num_actual_tokens: int  # scheduled tokens; rows past this are padding and produce zeros
    query_start_loc: torch.Tensor  # [num_reqs + 1] int32
    seq_lens: torch.Tensor  # [num_reqs] int32, num_computed_tokens + num_scheduled_tokens
    block_table: torch.Tensor  # [num_reqs, max_num_blocks_per_req] int32, physical block ids
    slot_mapping: torch.Tensor  # [num_tokens] int64, -1 for padding tokens
    max_query_len: int
    max_seq_len: int
    query_start_loc_cpu: list[int]
    seq_lens_cpu: list[int]
    # cumsum of seq_lens with a leading 0, [num_reqs + 1] int32: flash-attn's cu_seqlens_k. Built
    # lazily by backends that need it when the builder did not provide it.
    seq_start_loc: torch.Tensor | None = field(default=None)
    # A hybrid KV cache (engine/core/hybrid_kv_cache_manager.py): the step's metadata per group, each with its
    # group's block table and slot mapping (this object is group 0's); a layer reads its group's
    # (backend.GroupKVCache). None: one block table.
    groups: list["AttentionMetadata"] | None = field(default=None)
    # Chunked local attention (Llama 4): the step as per-chunk virtual requests (local_attention.py), which the
    # chunked layers attend with. None: the model has no such layers.
    local: "AttentionMetadata | None" = field(default=None)
    # Per request, the [start, end) positions whose tokens attend each other both ways (Gemma 3's images: each
    # image's tokens see the whole image, the rest stays causal); the scheduler keeps each such span in one chunk
    # (disable_chunked_mm_input). None: every request is causal. The torch and triton backends read it
    # (``supports_bidirectional_spans``).
    bidirectional_spans: list[tuple[tuple[int, int], ...]] | None = field(default=None)

    @property
    def num_reqs(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def device(self) -> torch.device:
        return self.query_start_loc.device

    @cached_property
    def query_lens_cpu(self) -> list[int]:
        loc = self.query_start_loc_cpu
        return [loc[i + 1] - loc[i] for i in range(self.num_reqs)]

    @cached_property
    def num_computed_tokens_cpu(self) -> list[int]:
        return [s - q for s, q in zip(self.seq_lens_cpu, self.query_lens_cpu)]

    @cached_property
    def split(self) -> DecodePrefillSplit:
        decodes = [i for i, q in enumerate(self.query_lens_cpu) if q == 1]
        prefills = [i for i, q in enumerate(self.query_lens_cpu) if q > 1]
        device = self.device
        return DecodePrefillSplit(
            decode_req_indices=decodes,
            prefill_req_indices=prefills,
            decode_req_index_tensor=torch.tensor(decodes, dtype=torch.long, device=device),
            decode_token_index_tensor=torch.tensor(
                [self.query_start_loc_cpu[i] for i in decodes], dtype=torch.long, device=device),
            decode_seq_lens=torch.tensor([self.seq_lens_cpu[i] for i in decodes], dtype=torch.long, device=device),
            max_decode_seq_len=max((self.seq_lens_cpu[i] for i in decodes), default=0),
        )

    def decode_groups(self, block_size: int, max_group_tokens: int | None = None,
                      sliding_window: int | None = None) -> list[DecodeGroup]:
        """The decodes grouped by the span of keys they read (see decode_groups.py), computed once per step
        and window (a model may mix full and sliding-window layers)."""
        cache = self.__dict__.setdefault("_decode_groups", {})
        key = (block_size, max_group_tokens, sliding_window)
        if key not in cache:
            cache[key] = make_decode_groups(self.split.decode_req_indices, self.seq_lens_cpu,
                                            self.query_start_loc_cpu, self.block_table, block_size, max_group_tokens,
                                            sliding_window)
        return cache[key]

    def get_seq_start_loc(self) -> torch.Tensor:
        if self.seq_start_loc is None:
            loc = torch.zeros(self.num_reqs + 1, dtype=torch.int32, device=self.device)
            loc[1:] = torch.cumsum(self.seq_lens, dim=0, dtype=torch.int32)
            self.seq_start_loc = loc
        return self.seq_start_loc
