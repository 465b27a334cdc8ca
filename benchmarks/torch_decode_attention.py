"""The torch attention backend's decode path on the CPU: group gather budget, and prefix sharing.

    python -m benchmarks.torch_decode_attention [--threads 1] [--repeats 5]

Times one decode step's attention through all 8 layers of the generated small model's shape (8 query /
4 kv heads x 64, float32, 16-token blocks) for a few batches, side by side in one process:

* the decode groups' gathered K/V capped at 8 MiB (the backend's ``GROUP_GATHER_BYTES``) against no cap:
  a group that gathers tens of thousands of tokens at once no longer fits the last-level cache between
  the gather and the attention that reads it;
* every request sharing its first 512 tokens' blocks (a shared system prompt after prefix-cache hits)
  against no sharing: a block read by many requests in one step is read from cache after the first;
* each request's blocks scattered over the cache (as a long-running engine's shuffled free queue hands
  them out) against consecutive: each run of consecutive blocks is a gather from a new place, and the
  hardware prefetcher streams within a run only (the step-time feature ``kv_block_runs``).

Best of ``--repeats`` runs each; the ratio column is what the comparison is about.
"""

from __future__ import annotations

import random
import sys


import engine.runner.attention.torch_backend as torch_backend
from benchmarks.torch_attention_timing import BLOCK_SIZE, best_step_seconds, random_kv_cache, timing_arguments
from engine.runner.attention import build_attention_metadata


def decode_step_seconds(num_reqs: int, context: int, shared_tokens: int, gather_bytes: int, repeats: int,
                        scattered: bool = True) -> float:
    """Best time of the decode attention of one step (every layer) with this group budget, sharing and
    block placement."""
    blocks_per_request = -(-(context + 1) // BLOCK_SIZE)
    shared_blocks = shared_tokens // BLOCK_SIZE
    num_blocks = shared_blocks + num_reqs * (blocks_per_request - shared_blocks) + 1
    ids = list(range(1, num_blocks))
    if scattered:
        random.Random(0).shuffle(ids)
    prefix, rest = ids[:shared_blocks], ids[shared_blocks:]
    own = blocks_per_request - shared_blocks
    block_ids = [prefix + rest[i * own:(i + 1) * own] for i in range(num_reqs)]
    return best_step_seconds(random_kv_cache(num_blocks),
                             lambda: build_attention_metadata([context] * num_reqs, [1] * num_reqs, block_ids,
                                                              BLOCK_SIZE, device="cpu"),
                             num_reqs, repeats, "GROUP_GATHER_BYTES", gather_bytes)


def main(argv: list[str] | None = None) -> int:
    args = timing_arguments(__doc__, argv)
    capped = torch_backend.GROUP_GATHER_BYTES
    print(f"{'batch':<18} {'comparison':<34} {'ms':>8} {'baseline ms':>12} {'ratio':>6}")
    for num_reqs, context in ((64, 700), (32, 800), (16, 1500)):
        batch = f"{num_reqs} x {context} tokens"
        uncapped = decode_step_seconds(num_reqs, context, 0, 1 << 40, args.repeats)
        with_cap = decode_step_seconds(num_reqs, context, 0, capped, args.repeats)
        print(f"{batch:<18} {'groups capped at 8 MiB vs no cap':<34} {1e3 * with_cap:>8.1f} {1e3 * uncapped:>12.1f} "
              f"{with_cap / uncapped:>6.2f}")
        shared = decode_step_seconds(num_reqs, context, 512, capped, args.repeats)
        print(f"{batch:<18} {'512 shared prefix tokens vs none':<34} {1e3 * shared:>8.1f} {1e3 * with_cap:>12.1f} "
              f"{shared / with_cap:>6.2f}")
        in_order = decode_step_seconds(num_reqs, context, 0, capped, args.repeats, scattered=False)
        print(f"{batch:<18} {'blocks scattered vs consecutive':<34} {1e3 * with_cap:>8.1f} {1e3 * in_order:>12.1f} "
              f"{with_cap / in_order:>6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
