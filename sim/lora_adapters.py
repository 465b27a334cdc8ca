"""LoRA adapters in the simulator: their shapes and bytes, and what loading one costs.

An adapter of rank r adapts a projection W (in -> out) with two matrices, A (in x r, the "shrink") and B
(r x out, the "expand"): r * (in + out) weights per projection and layer, in the model's dtype. The
projections are a Llama-family layer's (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``, ``gate_proj``,
``up_proj``, ``down_proj``) with the model's own widths: grouped-query attention's narrower k and v, the
MLP's intermediate width. Under tensor parallelism each GPU holds vLLM's shard: a column-parallel
projection (q, k, v, gate, up) keeps A whole and splits B's outputs; a row-parallel one (o, down) splits A's
inputs and keeps B whole. The per-GPU widths are those of ``ModelShape.shard``.

vLLM keeps ``max_loras`` adapters on the device in slots sized for ``max_lora_rank`` (a smaller adapter is
zero-padded into its slot) and ``max_cpu_loras`` in host memory (LRU: sim/lora_slots.py). A step whose batch
names an adapter that is not on the device loads it before the forward pass, synchronously, as vLLM's worker
does in ``set_active_adapters``:

- from the host cache: each GPU copies its shard of the adapter's r-rank weights over its own PCIe link, all
  GPUs at once: ``shard bytes / (host_link_bandwidth_gbps * HOST_LINK_EFFICIENCY)``, the efficiency of KV
  offloading's loads (sim/kv_offload_loads.py);
- not in the host cache: first the whole adapter file read from disk, ``bytes / disk_read_bandwidth_gbps``
  (``HardwareSpec``; every tensor-parallel worker reads the file, in parallel), then the copy as above.

With a calibrated profile fitted on LoRA runs, both come from the loads it measured instead (its ``lora_loads``,
sim/lora_load_fit.py: seconds per byte of the same bytes, or per load), and no bandwidth is needed.

Not modelled: the per-tensor copies' launch costs (one per matrix and layer), PEFT's file parsing, and the
slot's zeroing beyond the adapter's rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.hardware import HardwareSpec
from sim.kv_offload_loads import HOST_LINK_EFFICIENCY
from sim.model_shapes import ModelShape, dtype_bytes
from workloads.lora_section import AdapterSpec

# The base projection each adapted module belongs to in vLLM's fused layers: its LoRA kernels (one shrink, one
# expand) run once per fused layer, over every adapted slice of it.
FUSED_LAYER = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "o_proj": "o_proj",
               "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj", "down_proj": "down_proj"}
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")


def module_widths(shape: ModelShape) -> dict[str, tuple[int, int]]:
    """(in, out) features of each adaptable projection of one layer of ``shape`` (a GPU's shard or the whole)."""
    h, q, kv, mlp = shape.hidden_size, shape.q_size, shape.kv_size, shape.intermediate_size
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, mlp), "up_proj": (h, mlp), "down_proj": (mlp, h)}


def in_plus_out(shape: ModelShape, target_modules: tuple[str, ...] | list[str]) -> int:
    """Sum over the targeted projections of (in + out) features, one layer: an adapter's weights per rank."""
    widths = module_widths(shape)
    return sum(sum(widths[name]) for name in target_modules)


def adapter_bytes(shape: ModelShape, adapter: AdapterSpec, dtype: str, rank: int | None = None) -> int:
    """Bytes of ``adapter``'s weights on ``shape`` (rank defaults to the adapter's own):
    rank x sum over targeted modules of (in + out) x layers x dtype bytes."""
    rank = adapter.rank if rank is None else rank
    return rank * in_plus_out(shape, adapter.target_modules) * shape.num_layers * dtype_bytes(dtype)


@dataclass(frozen=True)
class LoRASetup:
    """What the simulator needs of a LoRA workload: the engine's slots and each adapter's load times."""

    max_loras: int
    max_cpu_loras: int
    max_lora_rank: int
    # By the runner's id: seconds to copy the adapter from host memory to the device, and to read it from disk.
    copy_s: dict[int, float]
    disk_read_s: dict[int, float]
    names: dict[int, str]

    def describe(self) -> dict:
        return {"max_loras": self.max_loras, "max_cpu_loras": self.max_cpu_loras, "max_lora_rank": self.max_lora_rank,
                "num_adapters": len(self.names),
                "copy_s_max": max(self.copy_s.values(), default=0.0),
                "disk_read_s_max": max(self.disk_read_s.values(), default=0.0)}


def lora_setup(adapters: list[AdapterSpec], model: ModelShape, hardware: HardwareSpec, dtype: str,
               tensor_parallel_size: int, max_loras: int, max_cpu_loras: int, max_lora_rank: int,
               load_costs: dict | None = None) -> LoRASetup:
    """Each adapter's load times on ``hardware``, or from ``load_costs`` (a calibrated profile's ``lora_loads``:
    kind per_byte or per_load, copy_s, disk_read_s); refuses what the simulator cannot price (names the field)."""
    if load_costs is None and hardware.host_link_bandwidth_gbps is None:
        raise ValueError(f"workload.lora: hardware {hardware.name!r} names no host link to load adapters over; set "
                         "hardware.host_link_bandwidth_gbps")
    if model.is_mla:
        raise ValueError(f"workload.lora: {model.name!r} has multi-head latent attention, whose projections' adapters "
                         "the simulator does not price; LoRA is modelled on grouped-query attention models")
    if model.is_moe:
        mlp = sorted({name for adapter in adapters for name in adapter.target_modules if name in MLP_MODULES})
        if mlp:
            raise ValueError(f"workload.lora.target_modules: {mlp} of a mixture of experts ({model.name!r}) are its "
                             "experts, whose LoRA the simulator does not price; adapt the attention projections only")
    shard = model.shard(tensor_parallel_size)
    names = {adapter.int_id: adapter.name for adapter in adapters}
    if load_costs is not None:
        per_byte = load_costs["kind"] == "per_byte"
        copy_s = {adapter.int_id: load_costs["copy_s"] * (adapter_bytes(shard, adapter, dtype) if per_byte else 1)
                  for adapter in adapters}
        disk_read_s = {adapter.int_id: load_costs["disk_read_s"] * (adapter_bytes(model, adapter, dtype) if per_byte
                                                                     else 1) for adapter in adapters}
        return LoRASetup(max_loras, max_cpu_loras, max_lora_rank, copy_s, disk_read_s, names)
    link = hardware.host_link_bandwidth_gbps * 1e9 * HOST_LINK_EFFICIENCY
    disk = hardware.disk_read_bandwidth_gbps * 1e9
    copy_s = {adapter.int_id: adapter_bytes(shard, adapter, dtype) / link for adapter in adapters}
    disk_read_s = {adapter.int_id: adapter_bytes(model, adapter, dtype) / disk for adapter in adapters}
    return LoRASetup(max_loras, max_cpu_loras, max_lora_rank, copy_s, disk_read_s, names)

