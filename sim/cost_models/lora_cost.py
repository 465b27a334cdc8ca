"""What multi-LoRA serving adds to a step's time in the analytical model: the adapters' shrink and expand.

vLLM (Punica's SGMV, S-LoRA's kernels) adds ``x A_i B_i`` to each adapted projection's output, for the tokens of
requests running adapter i, with two kernels per fused base layer (``qkv_proj``, ``o_proj``, ``gate_up_proj``,
``down_proj``): a shrink (in -> rank) and an expand (rank -> out), each over every adapter of the batch at once.
Per step, summed over the targeted modules and the layers, at the roofline as the other operators:

- FLOPs: 2 x adapter tokens x rank x (in + out);
- bytes: each distinct adapter's weights once, rank x (in + out) (the batch's adapters differ, so a small batch
  reads nearly one adapter per request: the reason a multi-LoRA batch is slower than a single-adapter one, at
  the same size), plus the adapter tokens' activations: each module's input row, its rank-wide intermediate
  written and read back, and its output row read and written as the expand adds into it;
- time: max(FLOPs / achievable GEMM FLOP/s, bytes / achievable bandwidth), plus a launch overhead per kernel.

The rank is the slot's, ``engine.max_lora_rank``: vLLM stacks the active adapters in buffers of that rank (a
smaller adapter is zero-padded) and its kernels run over the whole slot. Widths are one GPU's shard
(sim/lora_adapters.py). A step without adapter tokens runs no LoRA kernel and costs nothing here.
"""

from __future__ import annotations

from sim.hardware import HardwareSpec
from sim.lora_adapters import FUSED_LAYER, module_widths
from sim.model_shapes import ModelShape, dtype_bytes

KERNELS_PER_FUSED_LAYER = 2  # one shrink, one expand


class LoRACost:
    def __init__(self, shard: ModelShape, hardware: HardwareSpec, dtype: str, max_lora_rank: int,
                 target_modules: tuple[str, ...] | list[str]) -> None:
        widths = module_widths(shard)
        layers, rank, element_bytes = shard.num_layers, max_lora_rank, dtype_bytes(dtype)
        in_plus_out = sum(sum(widths[name]) for name in target_modules)
        # Per adapter token and module: the input row read, rank values written and read back, the output row
        # read and written.
        activation_elements = sum(widths[name][0] + 2 * rank + 2 * widths[name][1] for name in target_modules)
        bandwidth = hardware.achievable_bandwidth
        self.rank = rank
        self.target_modules = tuple(target_modules)
        self.compute_s_per_token = layers * 2 * rank * in_plus_out / hardware.achievable_gemm_flops(dtype)
        self.weight_read_s_per_adapter = layers * rank * in_plus_out * element_bytes / bandwidth
        self.activation_s_per_token = layers * activation_elements * element_bytes / bandwidth
        num_fused = len({FUSED_LAYER[name] for name in target_modules})
        self.launch_s = layers * num_fused * KERNELS_PER_FUSED_LAYER * hardware.kernel_launch_overhead_s

    def time(self, num_lora_tokens: int, num_active_loras: int) -> float:
        """Seconds the step's LoRA kernels add; 0.0 for a step without adapter tokens."""
        if not num_lora_tokens:
            return 0.0
        return max(num_lora_tokens * self.compute_s_per_token,
                   num_active_loras * self.weight_read_s_per_adapter + num_lora_tokens * self.activation_s_per_token
                   ) + self.launch_s

    def describe(self) -> dict:
        return {"max_lora_rank": self.rank, "target_modules": list(self.target_modules),
                "weight_read_s_per_adapter": self.weight_read_s_per_adapter,
                "compute_s_per_token": self.compute_s_per_token,
                "activation_s_per_token": self.activation_s_per_token, "launch_s": self.launch_s}
