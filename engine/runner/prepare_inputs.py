"""Flat model inputs for one step, computed from the persistent batch with numpy (the seed's 5.1.2).

For the scheduled rows ``0 .. num_reqs - 1`` of the input batch, with ``n[i]`` tokens scheduled for row
``i`` and ``c[i]`` already computed:

    query_start_loc = [0, n[0], n[0] + n[1], ...]          (flash-attn's cu_seqlens_q)
    position of the j-th token of row i = c[i] + j
    input_ids = token_ids_cpu[i, position]
    seq_lens = c + n
    slot_mapping = block_table[i, position // block_size] * block_size + position % block_size
    logits_indices = query_start_loc[1:] - 1, only for rows whose chunk reaches their last known token

A row whose chunk stops short of its known tokens (a chunked prefill in progress) gets no logits and
no sample: it must not consume a draw from its seeded generator either.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from engine.runner.input_batch import InputBatch


@dataclass(slots=True)
class CommonAttentionMetadata:
    """Backend-independent description of the step's flat batch, on the host (vLLM's name)."""
    num_reqs: int
    num_actual_tokens: int
    query_start_loc: np.ndarray  # [num_reqs + 1] int32
    seq_lens: np.ndarray  # [num_reqs] int32
    num_computed_tokens: np.ndarray  # [num_reqs] int32, before this step
    block_table: np.ndarray  # [num_reqs, max blocks in use this step] int32
    slot_mapping: np.ndarray  # [num_actual_tokens] int64
    is_prefilling: np.ndarray  # [num_reqs] bool: num_computed_tokens < num_prompt_tokens
    max_query_len: int
    max_seq_len: int


@dataclass(slots=True)
class PreparedInputs:
    input_ids: np.ndarray  # [num_tokens] int64
    positions: np.ndarray  # [num_tokens] int64
    common: CommonAttentionMetadata
    logits_indices: np.ndarray  # [num_sampled] int64: flat index of each sampled row's last token
    sampled_rows: np.ndarray  # [num_sampled] int64: batch rows that get a token this step
    # A hybrid KV cache (block_table.MultiGroupBlockTable): ``common`` for each group, with that group's block
    # table and slot mapping (the first is ``common``). None: one block table.
    group_commons: list[CommonAttentionMetadata] | None = None


def prepare_inputs(batch: InputBatch, num_scheduled_tokens: np.ndarray) -> PreparedInputs:
    """Inputs for rows ``0 .. len(num_scheduled_tokens) - 1`` (every one scheduled, in row order)."""
    num_reqs = len(num_scheduled_tokens)
    num_scheduled = num_scheduled_tokens.astype(np.int64, copy=False)
    cu_num_tokens = np.cumsum(num_scheduled)
    total = int(cu_num_tokens[-1]) if num_reqs else 0

    # Row of every flat token, and its offset inside its row's chunk.
    req_indices = np.repeat(np.arange(num_reqs, dtype=np.int64), num_scheduled)
    offsets = np.arange(total, dtype=np.int64) - np.repeat(cu_num_tokens - num_scheduled, num_scheduled)
    num_computed = batch.num_computed_tokens_cpu[:num_reqs].astype(np.int64)
    positions = num_computed[req_indices] + offsets

    # A row of the token buffer is max_model_len + 1 wide (input_batch.py): index by its real width.
    row_width = batch.token_ids_cpu.shape[1]
    input_ids = batch.token_ids_cpu.reshape(-1)[req_indices * row_width + positions].astype(np.int64)
    slot_mapping = batch.block_table.compute_slot_mapping(req_indices, positions)

    query_start_loc = np.zeros(num_reqs + 1, dtype=np.int32)
    query_start_loc[1:] = cu_num_tokens
    seq_lens = (num_computed + num_scheduled).astype(np.int32)
    max_seq_len = int(seq_lens.max()) if num_reqs else 0
    # Only the columns this step can touch: the torch backend gathers whole rows of the table.
    block_size = batch.block_table.block_size
    num_block_columns = max(1, -(-max_seq_len // block_size))
    # A snapshot: the persistent table changes in the next step, the metadata must not.
    block_table = batch.block_table.block_table[:num_reqs, :num_block_columns].copy()

    sampled = seq_lens >= batch.num_tokens[:num_reqs]
    sampled_rows = np.flatnonzero(sampled)
    logits_indices = cu_num_tokens[sampled_rows] - 1

    common = CommonAttentionMetadata(
        num_reqs=num_reqs,
        num_actual_tokens=total,
        query_start_loc=query_start_loc,
        seq_lens=seq_lens,
        num_computed_tokens=num_computed.astype(np.int32),
        block_table=block_table,
        slot_mapping=slot_mapping,
        is_prefilling=num_computed < batch.num_prompt_tokens[:num_reqs],
        max_query_len=int(num_scheduled.max()) if num_reqs else 0,
        max_seq_len=max_seq_len,
    )
    group_commons = None
    tables = getattr(batch.block_table, "tables", None)
    if tables is not None:
        group_commons = [common] + [
            dataclasses.replace(common, block_table=table.block_table[:num_reqs, :num_block_columns].copy(),
                                slot_mapping=table.compute_slot_mapping(req_indices, positions))
            for table in tables[1:]]
    return PreparedInputs(input_ids, positions, common, logits_indices.astype(np.int64), sampled_rows, group_commons)
