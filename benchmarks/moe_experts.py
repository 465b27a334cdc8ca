"""The real engine's mixture-of-experts layer on the CPU, against transformers' on the same weights.

    python -m benchmarks.moe_experts [--threads 1] [--repeats 7]

One MoE layer of a scaled-down Mixtral shape (hidden 1024, 8 experts of width 3584, top-2, float32) on a
flat batch of T tokens, side by side in one process with identical weights and inputs:

* ours: ``engine.models.moe.SparseMoeBlock`` (the router, one stable sort of the top-k ids, each expert
  that received rows run once on all of them);
* transformers' ``MixtralSparseMoeBlock`` (a one-hot mask over experts, ``torch.where`` per expert).

T runs from a decode batch of one to a long prefill chunk. The columns are the medians of ``--repeats``
runs, their ratio, how many experts the batch touched, and the time per token. Both compute the same
rows (checked before timing): the comparison is the routing's bookkeeping. The ``experts`` column shows
what the simulator's cost model assumes of a mixture of experts (``sim/cost_models/analytical.py``): a
decode batch of one reads 2 of the 8 experts' weights, and by a few dozen tokens every expert runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

TOKEN_COUNTS = (1, 4, 16, 64, 256, 1024)
HIDDEN, EXPERT_WIDTH, NUM_EXPERTS, TOP_K = 1024, 3584, 8, 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as the tests use)")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per point (median reported)")
    args = parser.parse_args(argv)

    import torch
    import transformers
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    from engine.models.config import MoEConfig
    from engine.models.moe import SparseMoeBlock

    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()  # its experts warn when used outside a whole model
    generator = torch.Generator().manual_seed(0)
    ours = SparseMoeBlock(HIDDEN, MoEConfig(num_experts=NUM_EXPERTS, num_experts_per_token=TOP_K,
                                            expert_intermediate_size=EXPERT_WIDTH, normalize_top_k=True,
                                            routing_weights_in_float32=True))
    reference = MixtralSparseMoeBlock(MixtralConfig(hidden_size=HIDDEN, intermediate_size=EXPERT_WIDTH,
                                                    num_local_experts=NUM_EXPERTS, num_experts_per_tok=TOP_K))
    with torch.no_grad():
        for parameter in ours.parameters():
            parameter.normal_(0.0, 0.02, generator=generator)
        ours.gate.weight.normal_(0.0, 1.0, generator=generator)  # a router with preferences, as trained ones have
        reference.gate.weight.copy_(ours.gate.weight)
        reference.experts.gate_up_proj.copy_(ours.experts.gate_up_proj)
        reference.experts.down_proj.copy_(ours.experts.down_proj)
    reference.eval()

    def median_seconds(layer, x) -> float:
        times = []
        with torch.no_grad():
            layer(x)  # warm-up
            for _ in range(args.repeats):
                start = time.perf_counter()
                layer(x)
                times.append(time.perf_counter() - start)
        return statistics.median(times)

    print(f"MoE layer: hidden {HIDDEN}, {NUM_EXPERTS} experts x {EXPERT_WIDTH}, top-{TOP_K}, float32, "
          f"{args.threads} thread(s), median of {args.repeats}")
    print(f"{'tokens':>7} {'ours ms':>9} {'transformers ms':>16} {'ratio':>6} {'experts run':>12} {'ours us/token':>14}")
    for tokens in TOKEN_COUNTS:
        x = torch.randn(tokens, HIDDEN, generator=generator)
        with torch.no_grad():
            torch.testing.assert_close(ours(x), reference(x[None])[0], atol=1e-5, rtol=1e-4)
            experts_run = len(set(ours.route(x)[0].flatten().tolist()))
        mine = median_seconds(ours, x)
        theirs = median_seconds(lambda batch: reference(batch[None]), x)
        print(f"{tokens:>7} {1e3 * mine:>9.2f} {1e3 * theirs:>16.2f} {mine / theirs:>6.2f} {experts_run:>12} "
              f"{1e6 * mine / tokens:>14.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
