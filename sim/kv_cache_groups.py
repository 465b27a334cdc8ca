"""vLLM's hybrid KV-cache groups for a simulated model, and what they do to the pool's size.

The grouping is the engine's (engine/core/kv_cache_grouping.py): layers of one kind in groups of equal size, so
a block of any group holds ``layers_per_block`` layers for ``block_size`` tokens. The pool then has
``num_layers / layers_per_block`` times the blocks of one that holds every layer, and a long sequence fills
blocks at that rate in its full groups only (engine/core/hybrid_kv_cache_manager.py). A ``ModelShape`` knows how
many of its layers slide, not which: the count is all the grouping reads. Llama 4's chunked layers group the same
way, each group spelled by the chunk (CacheConfig.kv_cache_groups), and hold at most a chunk's blocks.
"""

from __future__ import annotations

from engine.core.kv_cache_grouping import KVCacheGrouping, group_layers
from sim.model_shapes import ModelShape


def hybrid_kv_cache_groups(model: ModelShape) -> KVCacheGrouping | None:
    """The groups of a model that mixes windowed (or chunked) and full layers; None for one that does not (every
    layer full, or every layer windowed: one table per request serves it)."""
    if model.attention_chunk_size is not None and model.num_chunked_layers is not None:
        span, num_partial = model.attention_chunk_size, model.num_chunked_layers
    elif model.sliding_window is not None and model.num_sliding_layers is not None:
        span, num_partial = model.sliding_window, model.num_sliding_layers
    else:
        return None
    return group_layers([None] * (model.num_layers - num_partial) + [span] * num_partial)
