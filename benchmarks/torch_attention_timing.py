"""What the torch-backend attention benchmarks share: the small model's attention shape, a filled paged
cache, and one step's attention through every layer timed best of N with one backend setting overridden.

Used by ``benchmarks.torch_decode_attention`` and ``benchmarks.torch_prefill_attention``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

import engine.runner.attention.torch_backend as torch_backend
from engine.runner.attention import AttentionMetadata, allocate_kv_caches, get_attention_backend

# The generated small model: 8 layers, 8 query / 4 KV heads of 64, float32, 16-token blocks.
NUM_LAYERS, NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE, BLOCK_SIZE = 8, 8, 4, 64, 16


def random_kv_cache(num_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    ((key_cache, value_cache),) = allocate_kv_caches(1, num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE,
                                                     torch.float32, "cpu")
    return key_cache.normal_(), value_cache.normal_()


def best_step_seconds(kv_cache: tuple[torch.Tensor, torch.Tensor], make_metadata: Callable[[], AttentionMetadata],
                      num_tokens: int, repeats: int, setting: str, value: object) -> float:
    """Best of ``repeats`` times of one step's attention through every layer, with the torch backend's
    module constant ``setting`` set to ``value`` meanwhile. ``make_metadata`` runs before each timed
    repeat (fresh metadata: whatever the backend derives from it per step is timed every time)."""
    backend = get_attention_backend("torch")
    saved = getattr(torch_backend, setting)
    setattr(torch_backend, setting, value)
    try:
        best = float("inf")
        for _ in range(repeats):
            metadata = make_metadata()
            query = torch.randn(num_tokens, NUM_HEADS, HEAD_SIZE)
            key, value_rows = torch.randn(num_tokens, NUM_KV_HEADS, HEAD_SIZE), torch.randn(num_tokens, NUM_KV_HEADS, HEAD_SIZE)
            started = time.perf_counter()
            for _ in range(NUM_LAYERS):
                backend.forward(query, key, value_rows, kv_cache, metadata, HEAD_SIZE ** -0.5)
            best = min(best, time.perf_counter() - started)
        return best
    finally:
        setattr(torch_backend, setting, saved)


def timing_arguments(doc: str, argv: list[str] | None) -> argparse.Namespace:
    """The benchmarks' command line (``--threads``, ``--repeats``), parsed, with torch's thread count set."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0], epilog=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    return args
