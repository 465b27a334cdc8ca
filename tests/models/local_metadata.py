"""A test step's metadata as the runner builds it for Llama 4's chunked layers: the batch, given as lists, in
CommonAttentionMetadata form, cut into per-chunk virtual requests (engine/runner/attention/local_attention.py)."""

import numpy as np
import torch

from engine.runner.attention.local_attention import local_attention_common
from engine.runner.attention_builders import get_metadata_builder
from engine.runner.prepare_inputs import CommonAttentionMetadata


def common_from_lists(computed, scheduled, block_lists, block_size) -> CommonAttentionMetadata:
    computed, scheduled = np.array(computed), np.array(scheduled)
    width = max(len(blocks) for blocks in block_lists)
    table = np.array([list(blocks) + [0] * (width - len(blocks)) for blocks in block_lists], dtype=np.int32)
    positions = np.concatenate([np.arange(c, c + n) for c, n in zip(computed, scheduled)])
    rows = np.repeat(np.arange(len(computed)), scheduled)
    query_start_loc = np.concatenate([[0], np.cumsum(scheduled)]).astype(np.int32)
    return CommonAttentionMetadata(
        num_reqs=len(computed), num_actual_tokens=int(scheduled.sum()), query_start_loc=query_start_loc,
        seq_lens=(computed + scheduled).astype(np.int32), num_computed_tokens=computed.astype(np.int32),
        block_table=table, slot_mapping=(table[rows, positions // block_size].astype(np.int64) * block_size
                                         + positions % block_size),
        is_prefilling=np.zeros(len(computed), dtype=bool), max_query_len=int(scheduled.max()),
        max_seq_len=int((computed + scheduled).max()))


def local_metadata(computed, scheduled, block_lists, block_size, chunk_size):
    """The torch backend's AttentionMetadata of the step's per-chunk virtual requests."""
    common = common_from_lists(computed, scheduled, block_lists, block_size)
    return get_metadata_builder("torch", torch.device("cpu")).build(local_attention_common(common, chunk_size,
                                                                                           block_size))
