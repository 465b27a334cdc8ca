"""A step's attention metadata for the model's forward, built from the prepared inputs (prepare_inputs.py).

One metadata object for the batch (group 0's block table and slot mapping); with a hybrid KV cache
(engine/core/kv_cache_grouping.py) one per group in ``groups``, which each layer picks by its cache's group; with
chunked local attention (Llama 4) the step's per-chunk virtual requests in ``local``, built over each chunked
group's own table (whose blocks before a request's current chunk may have been handed back), or over the one
table without a hybrid cache. Every common metadata is padded as the eager forward pads its tokens.
"""

from __future__ import annotations

from engine.core.kv_cache_grouping import KVCacheGrouping
from engine.runner.attention.local_attention import local_attention_common
from engine.runner.eager_shapes import pad_step_inputs


def step_attention_metadata(metadata_builder, prepared, common, padding: int, grouping: KVCacheGrouping | None,
                            attention_chunk_size: int | None, block_size: int, bidirectional_spans=None):
    """``common``: the batch's padded common metadata (group 0's); returns the metadata the forward reads.
    ``bidirectional_spans``: AttentionMetadata's, given to every group's."""
    attn_metadata = metadata_builder.build(common)
    attn_metadata.bidirectional_spans = bidirectional_spans
    group_commons = [common]
    if prepared.group_commons is not None:
        group_commons += [pad_step_inputs(prepared.input_ids, prepared.positions, group_common, padding)[2]
                          for group_common in prepared.group_commons[1:]]
        attn_metadata.groups = [attn_metadata] + [metadata_builder.build(group_common)
                                                  for group_common in group_commons[1:]]
        for metadata in attn_metadata.groups[1:]:
            metadata.bidirectional_spans = bidirectional_spans
    if attention_chunk_size:
        spans = (attention_chunk_size,) if grouping is None else grouping.windows
        for metadata, group_common, span in zip(attn_metadata.groups or [attn_metadata], group_commons, spans):
            if span is not None:  # a chunked group (a full group's layers read the ordinary metadata)
                metadata.local = metadata_builder.build(local_attention_common(group_common, attention_chunk_size,
                                                                               block_size))
    return attn_metadata
