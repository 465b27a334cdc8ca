"""How many KV-cache blocks fit on a device: the question vLLM answers at start-up, after the weights and an
activation reserve (``kv_cache_num_blocks``)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from sim.model_shapes import GIB, ModelShape, dtype_bytes, kv_cache_storage_dtype
from sim.weight_quantization import weight_quantization

if TYPE_CHECKING:  # only for the annotation; hardware.py does not import this module
    from sim.hardware import HardwareSpec


def kv_cache_num_blocks(model: ModelShape, hardware: HardwareSpec, dtype: str, block_size: int,
                        gpu_memory_utilization: float, activation_reserve_fraction: float = 0.03,
                        kv_cache_dtype: str | None = None, tensor_parallel_size: int = 1,
                        quantization: str | None = None, pipeline_parallel_size: int = 1,
                        draft_model: ModelShape | None = None, layers_per_block: int | None = None,
                        draft_quantization: str | None = None, data_parallel_size: int = 1) -> int:
    """How many KV-cache blocks fit, the way vLLM sizes its pool at start-up.

    vLLM takes ``total memory * gpu_memory_utilization``, subtracts the weights and the peak memory of a
    profiling forward pass (activations, CUDA context, cuBLAS workspace), and divides the rest by the
    bytes of one block. We do not run a profiling pass, so the peak is a fraction of device memory:
    3% is about 2.4 GiB on an 80 GB card, in line with what vLLM reports for 7-8B models at 8k batched
    tokens (1-2 GiB of activations plus under 1 GiB outside torch).

    With tensor parallelism every GPU holds its shard of the weights and of every block (each block
    spans all GPUs), so the count is what one GPU's memory fits of its shards (``ModelShape.shard``).
    With pipeline parallelism every stage's GPUs hold their layers' weights and their layers' part of every
    block, so the count is the smallest any stage fits (``ModelShape.pipeline_stage_layers``).

    A speculative decoding ``draft_model`` (one pipeline stage only) sits beside the model on the same GPUs,
    sharded alike and in the same dtype: its weights come off the budget, and every block holds the draft's
    KV of its tokens too (vLLM gives the draft's layers their own cache in the same block layout). Its weights are
    in ``draft_quantization`` when given (the model's MTP module is quantized as the model is).

    ``layers_per_block``: a hybrid KV cache's block holds one group's layers (sim/kv_cache_groups.py), not every
    layer (one pipeline stage, no draft model).

    ``data_parallel_size`` ranks of a mixture of experts (sim/cost_models/expert_parallel.py): each rank's pool, on
    GPUs that hold 1/D of the routed experts a rank alone would hold.
    """
    tensor_parallel_size = int(tensor_parallel_size)
    full_model = model
    model = model.shard(tensor_parallel_size)
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
        raise ValueError(f"cache.block_size must be a positive integer, got {block_size!r}")
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"cache.gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}")
    if not 0 <= activation_reserve_fraction < 1:
        raise ValueError(f"cache.activation_reserve_fraction must be in [0, 1), got {activation_reserve_fraction!r}")
    total = hardware.memory_bytes
    usable = total * gpu_memory_utilization
    reserve = total * activation_reserve_fraction
    kv_bytes_per_layer = block_size * model.kv_bytes_per_token_per_layer(kv_cache_storage_dtype(dtype, kv_cache_dtype))
    stage_layers = model.pipeline_stage_layers(pipeline_parallel_size)
    if layers_per_block is not None:
        if pipeline_parallel_size != 1 or draft_model is not None:
            raise ValueError("a hybrid KV cache is sized for one pipeline stage without a draft model")
        stage_layers = [layers_per_block]
    # Each stage's weights and bytes per block; the stage that fits the fewest blocks bounds the pool (every
    # stage holds its layers' part of the same block ids).
    stages = [(model.pipeline_stage_weight_bytes(stage, pipeline_parallel_size, dtype, quantization),
               layers * kv_bytes_per_layer) for stage, layers in enumerate(stage_layers)]
    if draft_model is not None:
        if pipeline_parallel_size != 1:
            raise ValueError("a draft model is sized for one pipeline stage only, got pipeline_parallel_size "
                             f"{pipeline_parallel_size}")
        draft = draft_model.shard(tensor_parallel_size)
        draft_kv_bytes_per_layer = block_size * draft.kv_bytes_per_token_per_layer(
            kv_cache_storage_dtype(dtype, kv_cache_dtype))
        stages = [(weights + draft.weight_bytes(dtype, draft_quantization),
                   block_bytes + draft.num_layers * draft_kv_bytes_per_layer)
                  for weights, block_bytes in stages]
    if data_parallel_size > 1:
        # Data-parallel ranks spread the routed experts over all their GPUs: each GPU holds 1/D of its rank's share
        # (of a draft's too: the MTP module's experts are spread as the model's are).
        expert_bytes = _routed_expert_bytes(model, dtype, quantization)
        if draft_model is not None:
            expert_bytes += _routed_expert_bytes(draft_model.shard(tensor_parallel_size), dtype, draft_quantization)
        stages = [(weights - expert_bytes * (1 - 1 / data_parallel_size), block_bytes)
                  for weights, block_bytes in stages]
    weights, block_bytes = min(stages, key=lambda stage: (usable - stage[0] - reserve) / stage[1])
    free_for_kv = usable - weights - reserve
    if free_for_kv < block_bytes:
        raise ValueError(
            f"model: {full_model.name} weights take {weights / GIB:.2f} GiB in {dtype}"
            f"{_per_gpu(tensor_parallel_size, pipeline_parallel_size)}"
            f", but {hardware.name} at "
            f"gpu_memory_utilization {gpu_memory_utilization} offers {usable / GIB:.2f} GiB, of which "
            f"{reserve / GIB:.2f} GiB is reserved for activations: no room for even one KV block "
            f"({block_bytes / 2**20:.2f} MiB). Use a larger device, more tensor or pipeline parallelism, a smaller "
            "model, a smaller dtype or quantized weights (engine.quantization: fp8, w8a16, w4a16).")
    return math.floor(free_for_kv / block_bytes)


def _routed_expert_bytes(shard: ModelShape, dtype: str, quantization: str | None) -> float:
    """Bytes of every routed expert of ``shard`` (0 for a dense model), in ``quantization``'s bytes when given."""
    scheme = weight_quantization(quantization)
    return shard.num_moe_layers * shard.num_experts * shard.expert_parameters * (
        scheme.bytes_per_weight if scheme is not None else dtype_bytes(dtype))


def _per_gpu(tensor_parallel_size: int, pipeline_parallel_size: int) -> str:
    parts = [f"tensor_parallel_size {tensor_parallel_size}"] if tensor_parallel_size > 1 else []
    if pipeline_parallel_size > 1:
        parts.append(f"pipeline_parallel_size {pipeline_parallel_size}")
    return f" per GPU at {' and '.join(parts)}" if parts else ""
