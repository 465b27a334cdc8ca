"""Build AttentionMetadata and positions from per-request lists (num_computed_tokens, block ids).

This is the straightforward construction, used by tests and small tools; the runner's persistent input
batch computes the same tensors incrementally. Both must agree with these definitions:

    position of query token j of request i = num_computed_tokens[i] + j
    slot of that token = block_table[i][position // block_size] * block_size + position % block_size
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.runner.attention.metadata import AttentionMetadata
from kernels.reshape_and_cache import PADDING_SLOT_ID


def compute_positions(num_computed_tokens: Sequence[int], num_scheduled_tokens: Sequence[int],
                      device: torch.device | str = "cpu") -> torch.Tensor:
    """Positions [num_tokens] int64 of the flat batch's tokens."""
    _check_lengths(num_computed_tokens, num_scheduled_tokens)
    counts = torch.tensor(list(num_scheduled_tokens), dtype=torch.long)
    starts = torch.tensor(list(num_computed_tokens), dtype=torch.long)
    query_start = torch.cumsum(counts, 0) - counts
    total = int(counts.sum())
    token_req = torch.repeat_interleave(torch.arange(len(counts)), counts, output_size=total)
    offsets = torch.arange(total) - query_start[token_req]
    return (starts[token_req] + offsets).to(device)


def build_attention_metadata(
    num_computed_tokens: Sequence[int],
    num_scheduled_tokens: Sequence[int],
    block_ids: Sequence[Sequence[int]],
    block_size: int,
    device: torch.device | str = "cpu",
    max_num_blocks_per_req: int | None = None,
    num_padded_tokens: int | None = None,
) -> AttentionMetadata:
    """Metadata for requests with the given context lengths, new-token counts and physical blocks.

    ``block_ids[i]`` must cover ``num_computed_tokens[i] + num_scheduled_tokens[i]`` tokens. The block
    table is padded with 0 (vLLM's convention; padded entries are never read for valid positions).
    ``num_padded_tokens`` pads the flat token dimension with slot -1, as a CUDA-graph-sized batch would.
    """
    _check_lengths(num_computed_tokens, num_scheduled_tokens)
    if len(block_ids) != len(num_computed_tokens):
        raise ValueError(f"block_ids has {len(block_ids)} requests, num_computed_tokens has {len(num_computed_tokens)}")
    if any(n <= 0 for n in num_scheduled_tokens):
        raise ValueError(f"every request needs at least one scheduled token, got {list(num_scheduled_tokens)}")
    seq_lens = [c + n for c, n in zip(num_computed_tokens, num_scheduled_tokens)]
    for i, (seq_len, blocks) in enumerate(zip(seq_lens, block_ids)):
        if len(blocks) * block_size < seq_len:
            raise ValueError(
                f"request {i} needs {-(-seq_len // block_size)} blocks for {seq_len} tokens, has {len(blocks)}")
    width = max_num_blocks_per_req or max((len(b) for b in block_ids), default=1)
    block_table = torch.zeros(len(block_ids), max(width, 1), dtype=torch.int32)
    for i, blocks in enumerate(block_ids):
        block_table[i, :len(blocks)] = torch.tensor(list(blocks), dtype=torch.int32)

    positions = compute_positions(num_computed_tokens, num_scheduled_tokens)
    counts = torch.tensor(list(num_scheduled_tokens), dtype=torch.long)
    token_req = torch.repeat_interleave(torch.arange(len(counts)), counts, output_size=positions.numel())
    block_numbers = block_table[token_req, positions // block_size].to(torch.long)
    slot_mapping = block_numbers * block_size + positions % block_size
    num_actual_tokens = positions.numel()
    if num_padded_tokens is not None and num_padded_tokens > num_actual_tokens:
        padding = torch.full((num_padded_tokens - num_actual_tokens,), PADDING_SLOT_ID, dtype=torch.long)
        slot_mapping = torch.cat([slot_mapping, padding])

    query_start_loc_cpu = [0]
    for n in num_scheduled_tokens:
        query_start_loc_cpu.append(query_start_loc_cpu[-1] + n)
    seq_start_loc_cpu = [0]
    for s in seq_lens:
        seq_start_loc_cpu.append(seq_start_loc_cpu[-1] + s)
    return AttentionMetadata(
        num_actual_tokens=num_actual_tokens,
        query_start_loc=torch.tensor(query_start_loc_cpu, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_table=block_table.to(device),
        slot_mapping=slot_mapping.to(device),
        max_query_len=max(num_scheduled_tokens, default=0),
        max_seq_len=max(seq_lens, default=0),
        query_start_loc_cpu=query_start_loc_cpu,
        seq_lens_cpu=seq_lens,
        seq_start_loc=torch.tensor(seq_start_loc_cpu, dtype=torch.int32, device=device),
    )


def _check_lengths(num_computed_tokens: Sequence[int], num_scheduled_tokens: Sequence[int]) -> None:
    if len(num_computed_tokens) != len(num_scheduled_tokens):
        raise ValueError(f"num_computed_tokens has {len(num_computed_tokens)} requests, "
                         f"num_scheduled_tokens has {len(num_scheduled_tokens)}")
