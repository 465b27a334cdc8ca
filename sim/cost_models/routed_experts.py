"""The routed experts of a mixture-of-experts layer on the roofline: one grouped GEMM per projection.

vLLM runs a layer's experts as a fused MoE kernel: the router's top-k picks ``num_experts_per_token`` of
``num_experts`` experts for every token, the tokens' rows are grouped by expert, and one grouped GEMM
computes gate+up for every (token, expert) pair, another computes down. Two things set its time:

* compute: every token goes through k experts, so T tokens make T * k rows, each costing one expert's
  gate+up and down FLOPs, whichever experts they land on.
* bytes: an expert's weights are read once per step if any token of the step is routed to it, and not
  at all otherwise. Under uniform routing each token picks k distinct experts of E, so a given expert is
  left out by one token with probability 1 - k/E and by all T tokens with (1 - k/E)^T: the step reads
  E * (1 - (1 - k/E)^T) experts on average. One token reads exactly k; past a few times E/k tokens
  every expert is read.

The time is the slower of the two, as for a dense projection (``LinearCost``). This is what makes a small
MoE decode cheap (batch 1 reads only k experts' weights, like a dense model of the active size), and
what makes it lose that advantage as the batch grows (more experts wake up each step, until the step
reads all of them and pays for the total size, with only T * k rows of compute to show for it).

Routing is assumed uniform and independent across tokens unless ``workload.expert_popularity`` skews it
(sim/expert_popularity.py: then the distinct experts are ``sum_e 1 - (1 - p_e) ** T``, fewer at mid batch sizes). Each expert's rows are also padded to the kernel's
tile (16-64 rows) in the real kernel, wasted compute that matters only where the step is bytes-bound
anyway, so it is left out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sim.expert_popularity import ExpertPopularity


def expected_distinct_experts(num_tokens: int, num_experts: int, experts_per_token: int) -> float:
    """Expected number of experts that at least one of ``num_tokens`` tokens is routed to, each token
    choosing ``experts_per_token`` distinct experts of ``num_experts`` uniformly and independently.

    k at one token, ``num_experts`` in the limit; 0 for no tokens."""
    if num_tokens <= 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - experts_per_token / num_experts) ** num_tokens)


@dataclass(frozen=True, slots=True)
class RoutedExpertsCost:
    """One layer's routed experts (or, ``scaled``, several layers'), in seconds.

    ``expert_weight_read_s`` is one expert's gate+up and down weights read once; ``compute_s_per_row`` and
    ``activation_s_per_row`` are one (token, expert) row's FLOPs at the GEMM rate and bytes in and out of
    both grouped GEMMs."""
    num_experts: int
    experts_per_token: int
    expert_weight_read_s: float
    compute_s_per_row: float
    activation_s_per_row: float
    # A router that favours some experts (workload.expert_popularity); None: uniform routing.
    popularity: ExpertPopularity | None = None

    def distinct_experts(self, num_tokens: int) -> float:
        if self.popularity is not None:
            return self.popularity.distinct_experts(num_tokens)
        return expected_distinct_experts(num_tokens, self.num_experts, self.experts_per_token)

    def time(self, num_tokens: int) -> float:
        rows = num_tokens * self.experts_per_token
        distinct = self.distinct_experts(num_tokens)
        return max(rows * self.compute_s_per_row,
                   distinct * self.expert_weight_read_s + rows * self.activation_s_per_row)

    def scaled(self, factor: float) -> RoutedExpertsCost:
        """The same experts in ``factor`` layers: every term of ``time`` multiplied by ``factor``."""
        return replace(self, expert_weight_read_s=factor * self.expert_weight_read_s,
                       compute_s_per_row=factor * self.compute_s_per_row,
                       activation_s_per_row=factor * self.activation_s_per_row)
