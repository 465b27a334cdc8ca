"""What an accelerator can do, and how much of it a serving engine actually gets.

A ``HardwareSpec`` holds two kinds of figures:

* datasheet peaks: dense (not 2:4-sparse) 16-bit tensor-core FLOP/s, FP32 FLOP/s, memory bandwidth, and
  the memory capacity the driver reports (``nvidia-smi``'s total, which is what CUDA programs see);
* efficiency factors: the fraction of each peak that real kernels reach, plus fixed costs that no
  roofline captures (a minimum duration per kernel, CPU-side scheduling per engine step).

The A100-80GB factors are fitted to measured per-operator timings (``benchmarks/cost_model_vs_a100.py``);
the other GPUs reuse the same factors scaled by judgement, and say so. A calibrated profile fitted from
real step traces (``sim/cost_models/calibrated.py``) replaces all of this when one exists.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields, replace

from sim.model_shapes import GIB, dtype_bytes

# Typical CPU-side cost of one vLLM V1 engine step that does not overlap with the GPU: scheduling,
# preparing input tensors, and turning sampled ids into outputs. V1 was built to bring this down to
# around a millisecond from the several milliseconds of V0.
DEFAULT_STEP_OVERHEAD_S = 1.0e-3


@dataclass(frozen=True, slots=True)
class HardwareSpec:
    name: str
    dense_fp16_tflops: float          # tensor-core FP16/BF16, dense (datasheet sparse figure / 2)
    fp32_tflops: float                # FP32 without tensor cores
    memory_bandwidth_gbps: float      # GB/s (10^9 bytes/s)
    memory_gib: float                 # device memory CUDA sees (nvidia-smi total), GiB
    # Defaults are the A100 fit (see the a100-80gb preset).
    gemm_flops_efficiency: float = 0.70       # fraction of peak FLOP/s a large cuBLAS GEMM reaches
    attention_flops_efficiency: float = 0.5   # fraction of peak FLOP/s a prefill attention kernel reaches
    bandwidth_efficiency: float = 0.75        # fraction of peak bandwidth a streaming kernel reaches
    kernel_launch_overhead_s: float = 3e-6    # added to every kernel: launch gap and minimum duration
    step_overhead_s: float = DEFAULT_STEP_OVERHEAD_S  # fixed CPU cost per engine step
    source: str = ""                          # where the datasheet figures come from
    # Dense FP8 tensor-core TFLOP/s (Hopper, Ada); 0 where there are none (Ampere), and fp8 weights are
    # then widened to 16 bits for the product (weight-only quantization: fewer bytes, no more FLOP/s).
    dense_fp8_tflops: float = 0.0
    # Tensor parallelism (engine.tensor_parallel_size > 1): the GPUs of one engine all-reduce activations
    # twice per layer over this link. GB/s one way per GPU (NVLink: half the datasheet's bidirectional
    # total; else PCIe x16 one way), the fraction an all-reduce's bus bandwidth reaches, and the fixed
    # cost of one all-reduce (what a decode step's kilobyte-sized ones mostly pay). None: no link known
    # (inline hardware that names none, the cpu placeholder), and tensor parallelism is refused.
    interconnect_bandwidth_gbps: float | None = None
    interconnect_efficiency: float = 0.75
    # GB/s one way between a GPU and host memory (its PCIe x16 link), over which KV offloading loads
    # (sim/kv_offload_loads.py). None: not known (a run that offloads KV must set it).
    host_link_bandwidth_gbps: float | None = None
    allreduce_latency_s: float | None = None
    # GB/s the host reads files at (a LoRA adapter's weights not in the host cache, engine.max_cpu_loras:
    # sim/lora_adapters.py). Not a GPU figure: the server's local NVMe, about 3 GB/s for a PCIe Gen4 x4 drive
    # reading sequentially; set it for the storage the adapters really live on (a network volume is slower).
    disk_read_bandwidth_gbps: float = 3.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"hardware.name must be a non-empty string, got {self.name!r}")
        for name in ("dense_fp16_tflops", "fp32_tflops", "memory_bandwidth_gbps", "memory_gib"):
            value = getattr(self, name)
            if not _is_number(value) or value <= 0:
                raise ValueError(f"hardware.{name} must be a positive number, got {value!r}")
        if not _is_number(self.dense_fp8_tflops) or self.dense_fp8_tflops < 0:
            raise ValueError(f"hardware.dense_fp8_tflops must be a number >= 0, got {self.dense_fp8_tflops!r}")
        if self.host_link_bandwidth_gbps is not None and (
                not _is_number(self.host_link_bandwidth_gbps) or self.host_link_bandwidth_gbps <= 0):
            raise ValueError(f"hardware.host_link_bandwidth_gbps must be a positive number, got "
                             f"{self.host_link_bandwidth_gbps!r}")
        if not _is_number(self.disk_read_bandwidth_gbps) or self.disk_read_bandwidth_gbps <= 0:
            raise ValueError(f"hardware.disk_read_bandwidth_gbps must be a positive number, got "
                             f"{self.disk_read_bandwidth_gbps!r}")
        if self.interconnect_bandwidth_gbps is not None and (
                not _is_number(self.interconnect_bandwidth_gbps) or self.interconnect_bandwidth_gbps <= 0):
            raise ValueError(f"hardware.interconnect_bandwidth_gbps must be a positive number, got "
                             f"{self.interconnect_bandwidth_gbps!r}")
        for name in ("gemm_flops_efficiency", "attention_flops_efficiency", "bandwidth_efficiency",
                     "interconnect_efficiency"):
            value = getattr(self, name)
            if not _is_number(value) or not 0 < value <= 1:
                raise ValueError(f"hardware.{name} must be a fraction in (0, 1], got {value!r}")
        for name in ("kernel_launch_overhead_s", "step_overhead_s", "allreduce_latency_s"):
            value = getattr(self, name)
            if value is None and name == "allreduce_latency_s":
                continue
            if not _is_number(value) or not 0 <= value < 1:
                raise ValueError(f"hardware.{name} must be a number of seconds in [0, 1), got {value!r}")

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    def peak_flops(self, dtype: str) -> float:
        """Peak FLOP/s for matrix products in ``dtype``: tensor cores for 16-bit (and 8-bit, counted at the
        16-bit rate, which is conservative), plain FP32 units for 32-bit (TF32 is off by default in torch)."""
        return (self.fp32_tflops if dtype_bytes(dtype) == 4 else self.dense_fp16_tflops) * 1e12

    def achievable_gemm_flops(self, dtype: str, quantization: str | None = None) -> float:
        """FLOP/s a large GEMM reaches: with fp8 weights, the fp8 rate where the device has one."""
        if quantization is not None and self.dense_fp8_tflops > 0:
            return self.dense_fp8_tflops * 1e12 * self.gemm_flops_efficiency
        return self.peak_flops(dtype) * self.gemm_flops_efficiency

    def achievable_attention_flops(self, dtype: str) -> float:
        return self.peak_flops(dtype) * self.attention_flops_efficiency

    @property
    def achievable_bandwidth(self) -> float:
        """Bytes per second a streaming kernel reaches."""
        return self.memory_bandwidth_gbps * 1e9 * self.bandwidth_efficiency

    def allreduce_time(self, num_bytes: float, num_gpus: int) -> float:
        """Seconds to all-reduce ``num_bytes`` over ``num_gpus`` GPUs: a ring sends and receives
        2 (n - 1) / n of the buffer on every GPU's link, after a fixed latency. 0 on one GPU."""
        if num_gpus <= 1:
            return 0.0
        latency_s, seconds_per_byte = self.allreduce_coefficients(num_gpus)
        return latency_s + num_bytes * seconds_per_byte

    def allreduce_coefficients(self, num_gpus: int) -> tuple[float, float]:
        """(fixed seconds, seconds per byte) of an all-reduce over ``num_gpus`` GPUs, for callers that
        time many of them (the cost model, once per step)."""
        self.check_link()
        link = self.interconnect_bandwidth_gbps * 1e9 * self.interconnect_efficiency
        return self.allreduce_latency_s, 2 * (num_gpus - 1) / num_gpus / link

    def send_coefficients(self) -> tuple[float, float]:
        """(fixed seconds, seconds per byte) of one GPU sending a buffer to the next over the link (pipeline
        parallelism's hand-over between stages); the fixed part is the all-reduce's latency."""
        self.check_link()
        return self.allreduce_latency_s, 1 / (self.interconnect_bandwidth_gbps * 1e9 * self.interconnect_efficiency)

    def check_link(self) -> None:
        """A ValueError naming the field when the link between GPUs is not known."""
        for name in ("interconnect_bandwidth_gbps", "allreduce_latency_s"):
            if getattr(self, name) is None:
                raise ValueError(f"hardware.{name}: {self.name!r} names no link between GPUs, which tensor "
                                 f"and pipeline parallelism need; set hardware.interconnect_bandwidth_gbps and "
                                 f"hardware.allreduce_latency_s (the GPU presets have them)")

    def to_dict(self) -> dict:
        return asdict(self)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_MIB = 1 / 1024  # nvidia-smi reports MiB; presets store GiB


def _preset(name: str, tflops16: float, tflops32: float, bandwidth: float, memory_mib: int, source: str,
            **factors: float) -> HardwareSpec:
    return HardwareSpec(name=name, dense_fp16_tflops=tflops16, fp32_tflops=tflops32,
                        memory_bandwidth_gbps=bandwidth, memory_gib=memory_mib * _MIB, source=source, **factors)


# Datasheet figures (NVIDIA product briefs; dense tensor-core rates are half the "with sparsity" ones).
# memory_gib is the total nvidia-smi shows for the card, e.g. 81559 MiB on an H100 80GB.
# Efficiency factors: the field defaults are the A100 fit (a100-80gb below); the others are not fitted.
# Hopper reaches a smaller fraction of its much higher peak with the cuBLAS and FlashAttention-2 kernels
# vLLM uses (about 600-700 of 989 TFLOP/s on large GEMMs), and the 72 W L4 throttles under tensor load.
# The link tensor-parallel GPUs all-reduce over. NVLink: the datasheet's total (900 GB/s NVLink 4 on
# H100/H200 SXM, 600 GB/s NVLink 3 on A100 SXM) halved for one direction; a small all-reduce costs about
# 8 us there (vLLM's custom all-reduce; NCCL's is slower). PCIe cards talk through the host: x16 one way
# (Gen5 64 GB/s, Gen4 32 GB/s) and about 25 us per small all-reduce. Not measured here: no multi-GPU
# machine was available; efficiency 0.75 is what NCCL's bus bandwidth typically reaches of the link.
NVLINK4 = {"interconnect_bandwidth_gbps": 450.0, "allreduce_latency_s": 8e-6}
NVLINK3 = {"interconnect_bandwidth_gbps": 300.0, "allreduce_latency_s": 8e-6}
NVLINK5 = {"interconnect_bandwidth_gbps": 900.0, "allreduce_latency_s": 8e-6}
PCIE5 = {"interconnect_bandwidth_gbps": 64.0, "allreduce_latency_s": 25e-6}
PCIE4 = {"interconnect_bandwidth_gbps": 32.0, "allreduce_latency_s": 25e-6}
# The link to host memory, whatever links the GPUs: every one of these cards sits on a PCIe x16 slot, Gen5
# for Hopper and Blackwell, Gen4 for Ampere and Ada (datasheets), one way.
HOST_GEN5 = {"host_link_bandwidth_gbps": 64.0}
HOST_GEN4 = {"host_link_bandwidth_gbps": 32.0}

HARDWARE_PRESETS: dict[str, HardwareSpec] = {spec.name: spec for spec in (
    _preset("h100-sxm", 989.5, 67.0, 3350, 81559, "NVIDIA H100 SXM5 80GB datasheet",
            gemm_flops_efficiency=0.68, attention_flops_efficiency=0.45, dense_fp8_tflops=1979.0, **NVLINK4, **HOST_GEN5),
    _preset("h100-pcie", 756.5, 51.0, 2000, 81559, "NVIDIA H100 PCIe 80GB datasheet",
            gemm_flops_efficiency=0.68, attention_flops_efficiency=0.45, dense_fp8_tflops=1513.0, **PCIE5, **HOST_GEN5),
    _preset("h200", 989.5, 67.0, 4800, 143771, "NVIDIA H200 SXM 141GB datasheet",
            gemm_flops_efficiency=0.68, attention_flops_efficiency=0.45, dense_fp8_tflops=1979.0, **NVLINK4, **HOST_GEN5),
    # HGX B200 (1,000 W): 2.25 PFLOP/s dense FP16/BF16, 4.5 dense FP8, 8 TB/s HBM3e, 180 GB per GPU
    # (DGX B200: 1,440 GB for eight), NVLink 5 at 1.8 TB/s both ways. Efficiencies: Hopper's, by judgement.
    _preset("b200", 2250.0, 80.0, 8000, 183359, "NVIDIA HGX/DGX B200 figures (180 GB per GPU)",
            gemm_flops_efficiency=0.68, attention_flops_efficiency=0.45, dense_fp8_tflops=4500.0, **NVLINK5, **HOST_GEN5),
    # Fitted by benchmarks/cost_model_vs_a100.py to measured per-operator A100 kernel times (TP=1,
    # Llama-2-7B, Llama-3-8B, Llama-2-70B layers, 1-32768 tokens): GEMMs at 70% of 312 TFLOP/s (218),
    # streaming at 75% of 2039 GB/s (1.53 TB/s; a batch-1 GEMV measured 1.5-1.6 TB/s), 3 us per kernel.
    # Attention efficiency is not in that data: 0.5 is FlashAttention-2's causal forward on A100.
    _preset("a100-80gb", 312.0, 19.5, 2039, 81920, "NVIDIA A100 SXM4 80GB datasheet",
            gemm_flops_efficiency=0.70, attention_flops_efficiency=0.5, bandwidth_efficiency=0.75,
            kernel_launch_overhead_s=3e-6, **NVLINK3, **HOST_GEN4),
    _preset("a100-40gb", 312.0, 19.5, 1555, 40960, "NVIDIA A100 SXM4 40GB datasheet",
            gemm_flops_efficiency=0.70, attention_flops_efficiency=0.5, bandwidth_efficiency=0.75,
            kernel_launch_overhead_s=3e-6, **NVLINK3, **HOST_GEN4),
    _preset("l4", 121.0, 30.3, 300, 23034, "NVIDIA L4 datasheet",
            gemm_flops_efficiency=0.6, attention_flops_efficiency=0.4, dense_fp8_tflops=242.5, **PCIE4, **HOST_GEN4),
    _preset("l40s", 362.05, 91.6, 864, 46068, "NVIDIA L40S datasheet",
            gemm_flops_efficiency=0.65, attention_flops_efficiency=0.45, dense_fp8_tflops=733.0, **PCIE4, **HOST_GEN4),
    # NVIDIA publishes no A10G datasheet; AWS G5 documentation and public comparisons give 70 dense
    # FP16 tensor TFLOP/s (the A10 has 125), 35 FP32 TFLOP/s and the A10's 600 GB/s GDDR6.
    _preset("a10g", 70.0, 35.0, 600, 23028, "AWS G5 (A10G) figures; no NVIDIA datasheet",
            gemm_flops_efficiency=0.7, attention_flops_efficiency=0.45, **PCIE4, **HOST_GEN4),
    # A placeholder for CPU runs of the tiny model: a few-core server with DDR memory, where each torch
    # operator costs tens of microseconds of Python and dispatch. Fit a calibrated profile instead.
    _preset("cpu", 1.0, 1.0, 100, 64 * 1024, "generic CPU placeholder (not a datasheet)",
            gemm_flops_efficiency=0.5, attention_flops_efficiency=0.3, bandwidth_efficiency=0.5,
            kernel_launch_overhead_s=20e-6, step_overhead_s=2e-3),
)}

_FIELDS = {f.name: f for f in fields(HardwareSpec)}


def resolve_hardware(value: str | dict | HardwareSpec) -> HardwareSpec:
    """A preset name, an inline mapping, or a ``HardwareSpec`` (returned as is).

    An inline mapping either gives every datasheet field, or starts from a preset and overrides some:
    ``{"preset": "a100-80gb", "bandwidth_efficiency": 0.75}``.
    """
    if isinstance(value, HardwareSpec):
        return value
    if isinstance(value, str):
        preset = HARDWARE_PRESETS.get(value.lower())
        if preset is None:
            raise ValueError(f"hardware: unknown preset {value!r}; presets: {', '.join(HARDWARE_PRESETS)}")
        return preset
    if not isinstance(value, dict):
        raise ValueError(f"hardware: expected a preset name or a mapping, got {value!r}")
    overrides = dict(value)
    for key in overrides:
        if key != "preset" and key not in _FIELDS:
            raise ValueError(f"hardware: unknown key {key!r} (known keys: preset, {', '.join(_FIELDS)})")
    preset_name = overrides.pop("preset", None)
    if preset_name is not None:
        return replace(resolve_hardware(str(preset_name)), **overrides)
    missing = [name for name, f in _FIELDS.items() if name not in overrides and f.default is MISSING]
    if missing:
        raise ValueError(f"hardware: missing {'keys' if len(missing) > 1 else 'key'} {', '.join(map(repr, missing))} "
                         f"(give them, or start from a preset with 'preset: a100-80gb'; presets: "
                         f"{', '.join(HARDWARE_PRESETS)})")
    return HardwareSpec(**overrides)
