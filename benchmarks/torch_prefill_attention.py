"""The torch attention backend's prefill path on the CPU: query slices against one score matrix per chunk.

    python -m benchmarks.torch_prefill_attention [--threads 1] [--repeats 5]

Times one prefill chunk's attention through all 8 layers of the generated small model's shape (8 query /
4 kv heads x 64, float32, 16-token blocks), side by side in one process: the backend as it is (chunks
attended in slices of ``PREFILL_QUERY_SLICE`` = 128 query rows, each slice scoring the keys up to its own
last row) against the same backend with one slice as large as the chunk (one masked SDPA call per
chunk, whose math path materializes the whole ``[heads, query, keys]`` score matrix).

The last columns are the nanoseconds per scored query-key pair and per layer, for each: they show the
point of slicing. With one slice per chunk a pair costs more once the score matrix outgrows the
last-level cache (a 1024-token prompt's matrix is 32 MiB at 8 heads), so a cost model linear in pairs
would mispredict long chunks; sliced, a pair costs about the same in a short chunk and a long one.

Best of ``--repeats`` runs each; the ratio column is what the comparison is about.
"""

from __future__ import annotations

import random
import sys


import engine.runner.attention.torch_backend as torch_backend
from benchmarks.torch_attention_timing import (BLOCK_SIZE, NUM_LAYERS, best_step_seconds, random_kv_cache,
                                              timing_arguments)
from engine.runner.attention import build_attention_metadata
from sim.cost_models.step_batch import sliced_prefill_pairs
# (chunk tokens, cached context tokens): short and long fresh prompts, chunks after a shared prefix, the
# second chunk of a long prompt, and a long chunk after a long context.
CHUNKS = ((64, 0), (128, 0), (256, 512), (512, 0), (1024, 0), (476, 1024), (1024, 1024))


def prefill_seconds(query_len: int, context: int, query_slice: int, repeats: int) -> float:
    """Best time of one chunk's attention through every layer, with this query slice."""
    seq_len = context + query_len
    num_blocks = -(-seq_len // BLOCK_SIZE) + 1
    ids = list(range(1, num_blocks))
    random.Random(0).shuffle(ids)  # blocks scattered over the cache, as a running engine hands them out
    metadata = build_attention_metadata([context], [query_len], [ids], BLOCK_SIZE, device="cpu")
    return best_step_seconds(random_kv_cache(num_blocks), lambda: metadata, query_len, repeats,
                             "PREFILL_QUERY_SLICE", query_slice)


def main(argv: list[str] | None = None) -> int:
    args = timing_arguments(__doc__, argv)
    query_slice = torch_backend.PREFILL_QUERY_SLICE
    print(f"{'chunk':<24} {'sliced ms':>10} {'one slice ms':>13} {'ratio':>6} "
          f"{'sliced ns/pair':>15} {'one slice ns/pair':>18}")
    for query_len, context in CHUNKS:
        sliced = prefill_seconds(query_len, context, query_slice, args.repeats)
        whole = prefill_seconds(query_len, context, 1 << 30, args.repeats)
        sliced_pairs = sliced_prefill_pairs(query_len, context)
        dense_pairs = query_len * (context + query_len)
        chunk = f"{query_len} after {context}"
        print(f"{chunk:<24} {1e3 * sliced:>10.1f} {1e3 * whole:>13.1f} {sliced / whole:>6.2f} "
              f"{1e9 * sliced / sliced_pairs / NUM_LAYERS:>15.1f} {1e9 * whole / dense_pairs / NUM_LAYERS:>18.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
