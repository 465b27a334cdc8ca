"""Chunked local attention (Llama 4's ``attention_chunk_size``) as ordinary causal attention over virtual requests.

In a chunked layer a query at position p sees the keys at positions ``chunk_start(p) .. p``, where ``chunk_start(p)
= p - p % chunk_size``: the sequence is cut into chunks that never look back across a boundary. A request's query
tokens are split where they cross a chunk boundary, and each piece becomes a request of its own whose context starts
at its chunk's first token: its block table is the request's from that chunk's first block on (so ``chunk_size``
must be a multiple of the block size), its computed count the piece's offset in the chunk. Plain causal attention
over these virtual requests is exactly the chunked attention, in every backend, without a mask of its own (vLLM's
"virtual batches" for local attention). Tokens keep their order and slots: the KV written is the same.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from engine.runner.prepare_inputs import CommonAttentionMetadata


def local_attention_common(common: CommonAttentionMetadata, chunk_size: int, block_size: int) -> CommonAttentionMetadata:
    """The step's batch as virtual requests that each stay within one chunk (module docstring)."""
    if chunk_size % block_size:
        raise ValueError(f"attention_chunk_size {chunk_size} is not a multiple of the KV block size {block_size}")
    blocks_per_chunk = chunk_size // block_size
    starts = common.num_computed_tokens.astype(np.int64)
    ends = common.seq_lens.astype(np.int64)
    # Each request's pieces: its query positions cut at every chunk boundary they cross.
    first_chunk, last_chunk = starts // chunk_size, (ends - 1) // chunk_size
    counts = last_chunk - first_chunk + 1
    request = np.repeat(np.arange(common.num_reqs), counts)
    chunk = np.repeat(first_chunk, counts) + np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    chunk_start = chunk * chunk_size
    piece_start = np.maximum(starts[request], chunk_start)
    piece_end = np.minimum(ends[request], chunk_start + chunk_size)
    query_lens = piece_end - piece_start
    query_start_loc = np.zeros(len(request) + 1, dtype=np.int32)
    np.cumsum(query_lens, out=query_start_loc[1:])
    seq_lens = (piece_end - chunk_start).astype(np.int32)
    num_block_columns = max(1, -(-int(seq_lens.max()) // block_size))
    columns = (chunk * blocks_per_chunk)[:, None] + np.arange(num_block_columns)[None, :]
    table = common.block_table[request[:, None], np.minimum(columns, common.block_table.shape[1] - 1)]
    table = np.where(columns < common.block_table.shape[1], table, 0).astype(np.int32)
    return dataclasses.replace(
        common, num_reqs=len(request), query_start_loc=query_start_loc, seq_lens=seq_lens,
        num_computed_tokens=(piece_start - chunk_start).astype(np.int32), block_table=table,
        is_prefilling=common.is_prefilling[request], max_query_len=int(query_lens.max()),
        max_seq_len=int(seq_lens.max()))
