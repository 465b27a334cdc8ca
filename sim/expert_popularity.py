"""How often a mixture of experts' router picks each expert (``workload.expert_popularity``), and what that does to a
step: fewer distinct experts' weights to read, and, with expert parallelism, a busiest GPU that sets the pace
unless vLLM's expert-parallel load balancer (``engine.enable_eplb``) spreads the hot experts.

Uniform routing (the default) gives every expert the same chance k / E to be among a token's k. ``{zipf: s}``
weights expert i of a random order (the workload's seed) by ``1 / (i + 1) ** s``; a token's k experts are drawn
in proportion, so expert e is among them with probability p_e, found by capping k * w_e / sum(w) at 1 and sharing
the rest among the others until the p_e sum to k. A step of T tokens then reads ``sum_e 1 - (1 - p_e) ** T``
experts' weights (uniform: E * (1 - (1 - k/E) ** T)).

Under expert parallelism vLLM places experts on GPUs in contiguous blocks (expert e on GPU e // (E / G)); GPU g
gets ``T * sum of its p_e`` rows and reads its own distinct experts, and the step waits for the busiest. With
EPLB the hot experts are replicated and moved until every GPU has the same share (its extra copies' memory is not
counted).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from workloads.random_streams import Stream, random_stream

if TYPE_CHECKING:
    from sim.model_shapes import ModelShape
    from workloads import WorkloadConfig


class ExpertPopularity:
    """Per-expert inclusion probabilities of a layer's router (the same for every layer) and what follows."""

    def __init__(self, inclusion: np.ndarray, experts_per_token: int) -> None:
        self.inclusion = np.asarray(inclusion, dtype=np.float64)
        self.experts_per_token = experts_per_token
        # Per step on the simulator's hot path: each answer computed once per token count.
        self._distinct: dict[int, float] = {}
        self._busiest: dict[tuple[int, int], tuple[float, float]] = {}

    @classmethod
    def from_weights(cls, weights: np.ndarray, experts_per_token: int) -> ExpertPopularity:
        """Inclusion probabilities for k draws in proportion to ``weights`` without repeats: k * w / sum(w), each
        capped at 1, the excess shared among the uncapped in proportion, until they sum to k."""
        weights = np.asarray(weights, dtype=np.float64)
        inclusion = np.zeros_like(weights)
        capped = np.zeros(len(weights), dtype=bool)
        remaining = float(experts_per_token)
        while True:
            free = ~capped
            share = remaining * weights[free] / weights[free].sum()
            over = share > 1
            if not over.any():
                inclusion[free] = share
                return cls(inclusion, experts_per_token)
            newly = np.flatnonzero(free)[over]
            capped[newly] = True
            inclusion[newly] = 1.0
            remaining -= len(newly)

    @classmethod
    def zipf(cls, exponent: float, num_experts: int, experts_per_token: int, seed: int) -> ExpertPopularity:
        """Zipf weights over the experts in a random order drawn from ``seed`` (hot experts fall anywhere)."""
        order = random_stream(seed, Stream.EXPERT_POPULARITY).permutation(num_experts)
        weights = np.empty(num_experts)
        weights[order] = 1.0 / np.arange(1, num_experts + 1, dtype=np.float64) ** exponent
        return cls.from_weights(weights, experts_per_token)

    def distinct_experts(self, num_tokens: int) -> float:
        """Expected experts some of ``num_tokens`` tokens is routed to."""
        value = self._distinct.get(num_tokens)
        if value is None:
            value = self._distinct[num_tokens] = float(np.sum(1.0 - (1.0 - self.inclusion) ** num_tokens)) \
                if num_tokens > 0 else 0.0
        return value

    def busiest_gpu(self, num_gpus: int, num_tokens: int) -> tuple[float, float]:
        """With the experts placed in ``num_gpus`` contiguous blocks: the largest share of the step's rows one GPU
        gets, and the most distinct experts one GPU reads, for a step of ``num_tokens`` tokens."""
        key = (num_gpus, num_tokens)
        if key not in self._busiest:
            self._busiest[key] = self._busiest_gpu(num_gpus, num_tokens)
        return self._busiest[key]

    def _busiest_gpu(self, num_gpus: int, num_tokens: int) -> tuple[float, float]:
        blocks = self.inclusion.reshape(num_gpus, -1)
        share = float(blocks.sum(axis=1).max()) / self.experts_per_token
        if num_tokens <= 0:
            return share, 0.0
        return share, float((1.0 - (1.0 - blocks) ** num_tokens).sum(axis=1).max())


def price_expert_popularity(workload: WorkloadConfig, model: ModelShape, cost_models: list) -> None:
    """Apply ``engine.expert_popularity`` and ``engine.enable_eplb`` to the analytical ``cost_models`` of a run (the
    model's, and an MTP draft's whose experts follow the same router); ValueError naming the field for what does not
    apply."""
    engine = workload.engine
    popularity, eplb = engine.expert_popularity, engine.enable_eplb
    if popularity == "uniform" and not eplb:
        return
    field = "engine.expert_popularity" if popularity != "uniform" else "engine.enable_eplb"
    if not model.is_moe:
        raise ValueError(f"{field}: {model.name!r} is not a mixture of experts")
    if eplb and not (engine.data_parallel_size > 1):
        raise ValueError("engine.enable_eplb: true balances expert-parallel GPUs, simulated with data-parallel ranks "
                         "(engine.data_parallel_size > 1)")
    gpus = engine.data_parallel_size * engine.tensor_parallel_size
    if engine.data_parallel_size > 1 and model.num_experts % gpus:
        raise ValueError(f"{field}: the {model.num_experts} experts of {model.name!r} do not split evenly over "
                         f"{gpus} GPUs (data_parallel_size x tensor_parallel_size)")
    router = None if popularity == "uniform" else ExpertPopularity.zipf(
        popularity["zipf"], model.num_experts, model.num_experts_per_token, workload.seed)
    for cost_model in cost_models:
        if not hasattr(cost_model, "price_expert_popularity"):
            raise ValueError(f"{field} needs the analytical cost model; a calibrated profile has no experts' terms")
        cost_model.price_expert_popularity(router, eplb)
