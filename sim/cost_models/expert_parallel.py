"""Data-parallel attention with expert-parallel MoE layers (vLLM's ``--data-parallel-size D
--enable-expert-parallel``, the way DeepSeek-V3 and other large mixtures of experts are served at scale).

Each of the D data-parallel ranks is an engine of its own (its scheduler, its requests, its KV cache) on
``tensor_parallel_size`` GPUs holding the attention, the dense layers, the shared experts, the embedding and the
head; the routed experts are spread over all D x tp GPUs, whole experts to each. So the MoE layers couple the
ranks: every forward pass, every rank sends its tokens to the GPUs holding their experts and gathers the results
back (two all-to-alls per MoE layer), and a rank with nothing to run still joins with an empty batch. The ranks
step in lockstep (sim/data_parallel_loop.py), and a step takes

    max over ranks of (its own batch without the routed experts) + the routed experts' share of one GPU
    (T x k rows over D x tp GPUs, and its experts' weights the step's T tokens touch) + the all-to-alls
    (the busiest rank's tokens, k rows each, to the other GPUs and back)

with T the tokens of all ranks. Under uniform routing every GPU gets the mean share of the experts' work. With a
skewed router (``workload.expert_popularity``, sim/expert_popularity.py) the GPU holding the hottest experts
gets more rows and reads more experts, and the step waits for it, unless ``engine.enable_eplb`` balances the
GPUs (then each gets the mean share of the fewer experts skewed routing touches). Not modelled: the random
spread of rows around the mean, and DeepEP's or pplx's kernels' own latencies beyond the link's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sim.cost_models.routed_experts import RoutedExpertsCost


@dataclass(frozen=True, slots=True)
class ExpertParallelMoE:
    """Every MoE layer's routed experts and all-to-alls, for one GPU of a lockstep step."""
    data_parallel_size: int
    experts: RoutedExpertsCost      # all MoE layers, one GPU's mean share of the experts and of their rows
    dispatch_latency_s: float       # all MoE layers' all-to-alls, the fixed part
    dispatch_s_per_token: float     # ... and per token of the busiest rank
    num_gpus: int = 1               # the GPUs the experts are spread over (data_parallel_size x tensor_parallel_size)
    balanced: bool = False          # EPLB: every GPU the mean share even under skewed routing

    def time(self, total_tokens: int, max_rank_tokens: int) -> float:
        """Seconds of a step whose ranks run ``total_tokens`` tokens, the busiest ``max_rank_tokens``."""
        if total_tokens == 0:
            return 0.0
        return self.experts_time(total_tokens) + self.dispatch_latency_s + max_rank_tokens * self.dispatch_s_per_token

    def experts_time(self, total_tokens: int) -> float:
        """The routed experts' seconds on the GPU that sets the pace (every GPU alike under uniform routing)."""
        experts = self.experts
        if experts.popularity is None or self.balanced:
            return experts.time(total_tokens)
        # ``experts`` holds one GPU's mean share: a whole expert's row or weights cost num_gpus times its terms.
        share, distinct = experts.popularity.busiest_gpu(self.num_gpus, total_tokens)
        rows = total_tokens * experts.experts_per_token * share * self.num_gpus
        return max(rows * experts.compute_s_per_row,
                   distinct * self.num_gpus * experts.expert_weight_read_s + rows * experts.activation_s_per_row)

    def with_popularity(self, popularity, balanced: bool) -> ExpertParallelMoE:
        return replace(self, experts=replace(self.experts, popularity=popularity), balanced=balanced)

    def describe(self) -> dict:
        return {"data_parallel_size": self.data_parallel_size, "dispatch_latency_s": self.dispatch_latency_s,
                "dispatch_s_per_token": self.dispatch_s_per_token, "eplb": self.balanced}


def expert_parallel_moe(experts_all_layers: RoutedExpertsCost, data_parallel_size: int, tensor_parallel_size: int,
                        num_moe_layers: int, experts_per_token: int, hidden_bytes: int,
                        link_latency_s: float, link_s_per_byte: float) -> ExpertParallelMoE:
    """From the rank's own (tensor-parallel) experts cost: its 1/D share over the D x tp GPUs, and two all-to-alls
    per MoE layer, each sending every token's ``experts_per_token`` rows of ``hidden_bytes`` to the other GPUs
    (all but 1/(D x tp) of them leave the GPU), each of a rank's tp GPUs its share of the rank's tokens."""
    gpus = data_parallel_size * tensor_parallel_size
    leaving = (gpus - 1) / gpus
    return ExpertParallelMoE(
        data_parallel_size=data_parallel_size,
        experts=experts_all_layers.scaled(1 / data_parallel_size),
        dispatch_latency_s=2 * num_moe_layers * link_latency_s,
        dispatch_s_per_token=2 * num_moe_layers * experts_per_token * hidden_bytes * leaving / tensor_parallel_size
        * link_s_per_byte,
        num_gpus=gpus)
