"""From a validated workload to everything a run needs: model, hardware, core configs, cost model, requests.

Derived values are computed here and only here: the KV-pool size from the memory budget when
``num_gpu_blocks`` is null, and ``max_model_len`` from the model when it is null.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

from engine.core import CacheConfig, SchedulerConfig
from sim.calibrated_lora import check_profile_prices_lora
from sim.calibrated_speculation import ngram_lookup_cost
from sim.cost_models import AnalyticalCostModel, CalibratedCostModel, CostModel, load_cost_model
from sim.hardware import HardwareSpec, resolve_hardware
from engine.core.kv_cache_grouping import KVCacheGrouping
from sim.kv_cache_groups import hybrid_kv_cache_groups
from sim.kv_offload_loads import HOST_LINK_EFFICIENCY, HostLinkSetup, offload_capacity_blocks
from sim.lora_adapters import LoRASetup, lora_setup
from sim.vision_setup import VisionSetup, VisionSetupError, size_encoder_budget, vision_setup
from sim.model_presets import resolve_model
from sim.kv_cache_capacity import kv_cache_num_blocks
from sim.model_shapes import ModelShape, kv_cache_storage_dtype
from sim.eagle_draft import EAGLE_METHODS, eagle_draft_shape
from sim.mtp_draft import mtp_draft_shape
from sim.data_parallel_setup import DataParallelError, check_data_parallel
from sim.expert_popularity import price_expert_popularity
from sim.speculation import SpeculationSetup
from workloads import RequestSpec, WorkloadConfig, generate_requests


# What one KV block costs the simulator's process (the core's block object and its queue links: about
# 125 bytes measured, 18 million blocks in 2.2 GB), and the most the pools of one run may take.
BYTES_PER_SIMULATED_BLOCK = 125
MAX_SIMULATED_POOL_BYTES = 8 * 2**30
# A host-tier block is a hash in an ordered dict (engine/core/kv_offload.py).
BYTES_PER_SIMULATED_HOST_BLOCK = 150


class SetupError(ValueError):
    """A workload that validates on its own but cannot run with the chosen model or hardware."""


@dataclass
class RunSetup:
    workload: WorkloadConfig
    model: ModelShape
    hardware: HardwareSpec
    scheduler_config: SchedulerConfig
    cache_config: CacheConfig
    cost_model: CostModel
    requests: list[RequestSpec]
    # KV offloading (engine.kv_offloading_size_gib): what a load from the host costs; None without it.
    host_link: HostLinkSetup | None = field(default=None)
    # Speculative decoding (engine.speculative_decoding with num_speculative_tokens > 0); None without it.
    speculation: SpeculationSetup | None = field(default=None)
    # Multi-LoRA serving (workload.lora): the adapter slots and each adapter's load times; None without adapters.
    lora: LoRASetup | None = field(default=None)
    # A workload with images (workload.images): the model's vision encoder; None without images.
    vision: VisionSetup | None = field(default=None)

    def describe(self) -> dict:
        """The resolved configuration, for summary.json."""
        described = {
            "workload": self.workload.to_dict(),
            "model": self.model.to_dict(),
            "hardware": self.hardware.to_dict(),
            "scheduler": {name: getattr(self.scheduler_config, name) for name in SchedulerConfig.__slots__},
            "cache": {name: getattr(self.cache_config, name) for name in CacheConfig.__slots__},
            "cost_model": self.cost_model.describe(),
        }
        if self.speculation is not None:  # (a run without it describes itself as it always did)
            described["speculative_decoding"] = self.speculation.describe()
        if self.lora is not None:
            described["lora"] = self.lora.describe()
        if self.vision is not None:
            described["multimodal"] = self.vision.describe()
        return described


def _named(field: str, error: Exception) -> SetupError:
    message = str(error)
    return SetupError(message if message.startswith(field) else f"{field}: {message}")


def effective_quantization(requested: str | None, model, cost_model_spec) -> str | None:
    """``engine.quantization`` when set; else the scheme the checkpoint is stored in, which vLLM runs it in, on the
    analytical cost model (a calibrated profile measured the real runner, which dequantizes at load)."""
    if requested is not None or model.stored_quantization is None:
        return requested
    analytical = cost_model_spec in (None, "analytical") or (
        isinstance(cost_model_spec, dict) and cost_model_spec.get("kind") == "analytical")
    return model.stored_quantization if analytical else None


def build_setup(workload: WorkloadConfig, cost_model_spec: str | dict | None = None,
                requests: list[RequestSpec] | None = None) -> RunSetup:
    try:
        model = resolve_model(workload.model)
    except (ValueError, OSError) as error:
        raise _named("model", error) from None
    try:
        hardware = resolve_hardware(workload.hardware)
    except ValueError as error:
        raise _named("hardware", error) from None
    engine = workload.engine
    quantization = effective_quantization(engine.quantization, model, cost_model_spec)
    try:
        model.shard(engine.tensor_parallel_size)
        model.pipeline_stage_layers(engine.pipeline_parallel_size)
    except ValueError as error:
        raise SetupError(str(error)) from None
    if engine.async_scheduling and engine.pipeline_parallel_size > 1:
        raise SetupError(f"engine.async_scheduling: true is not simulated with pipeline parallelism "
                         f"(engine.pipeline_parallel_size {engine.pipeline_parallel_size}); set one of them back")
    if engine.async_scheduling and workload.cluster.disaggregated:
        raise SetupError(f"engine.async_scheduling: true is not simulated in a disaggregated cluster "
                         f"(cluster.prefill_replicas {workload.cluster.prefill_replicas}); set one of them back")
    if engine.pipeline_parallel_size > 1 and workload.cluster.disaggregated:
        raise SetupError(f"engine.pipeline_parallel_size: {engine.pipeline_parallel_size} stages are not simulated in a "
                         f"disaggregated cluster (cluster.prefill_replicas {workload.cluster.prefill_replicas}); set "
                         "engine.pipeline_parallel_size=1 or cluster.prefill_replicas=0")
    try:
        data_parallel_size = check_data_parallel(workload, model)
    except DataParallelError as error:
        raise SetupError(str(error)) from None
    # A mixture of experts' ranks spread the experts over their GPUs; a dense model's ranks are whole replicas.
    expert_parallel_ranks = data_parallel_size if model.is_moe else 1
    num_speculative_tokens, draft_model = _speculative_decoding(workload, model)
    groups = _hybrid_groups(workload, model, draft_model)
    if engine.num_gpu_blocks is not None:
        num_gpu_blocks = engine.num_gpu_blocks
    else:
        try:
            num_gpu_blocks = kv_cache_num_blocks(
                model, hardware, workload.dtype, engine.block_size, engine.gpu_memory_utilization,
                kv_cache_dtype=engine.kv_cache_dtype,
                tensor_parallel_size=engine.tensor_parallel_size, quantization=quantization,
                pipeline_parallel_size=engine.pipeline_parallel_size, draft_model=draft_model,
                draft_quantization=quantization if _drafts_with_mtp(workload) else None,
                data_parallel_size=expert_parallel_ranks,
                layers_per_block=None if groups is None else groups.layers_per_block)
        except ValueError as error:
            raise _named("engine.gpu_memory_utilization", error) from None
    num_replicas = max(1, workload.cluster.num_replicas) * data_parallel_size  # every rank has its own pool
    replica_bytes = num_gpu_blocks * BYTES_PER_SIMULATED_BLOCK
    if replica_bytes * num_replicas > MAX_SIMULATED_POOL_BYTES:
        # Every block is a Python object in the core, made on first use; a run that reuses cached blocks only once
        # the never-used ones are gone makes them all, and a tiny model on a large GPU derives tens of millions.
        if replica_bytes <= MAX_SIMULATED_POOL_BYTES:
            field = "cluster.num_replicas"
        else:
            field = "engine.num_gpu_blocks" if engine.num_gpu_blocks is not None else "engine.gpu_memory_utilization"
        raise SetupError(f"{field}: {num_replicas} replica(s) of {num_gpu_blocks:,} KV blocks (model {model.name!r} on "
                         f"{hardware.name}) would take about {replica_bytes * num_replicas / 2**30:.1f} GiB of block "
                         f"objects in this process, past {MAX_SIMULATED_POOL_BYTES / 2**30:g} GiB; set "
                         "engine.num_gpu_blocks to what the workload needs, or fewer replicas")
    max_model_len = engine.max_model_len or model.max_position_embeddings
    if max_model_len > model.max_position_embeddings:
        # As vLLM (and this project's real executor) refuse: past its position embeddings the model has
        # never seen a position, so a simulated run there would time requests no real engine serves.
        raise SetupError(f"engine.max_model_len: {max_model_len} exceeds what model {model.name!r} supports "
                         f"({model.max_position_embeddings}, its max_position_embeddings)")
    num_offload_blocks, host_link = _kv_offloading(workload, model, hardware)
    if num_offload_blocks and model.sliding_window is not None and model.sliding_window_fraction == 1:
        raise SetupError(f"engine.kv_offloading_size_gib: {engine.kv_offloading_size_gib:g} GiB is not supported with "
                         f"model {model.name!r}, whose layers attend a sliding window of {model.sliding_window} tokens; "
                         "set engine.kv_offloading_size_gib=0")
    try:
        cache_config = CacheConfig(block_size=engine.block_size, num_gpu_blocks=num_gpu_blocks,
                                   enable_prefix_caching=engine.enable_prefix_caching,
                                   num_offload_blocks=num_offload_blocks, sliding_window=model.sliding_window,
                                   sliding_window_fraction=model.sliding_window_fraction,
                                   attention_chunk_size=model.attention_chunk_size,
                                   attention_chunk_fraction=model.attention_chunk_fraction,
                                   kv_cache_groups=None if groups is None else groups.windows,
                                   eviction_policy=engine.prefix_cache_eviction_policy)
        scheduler_config = SchedulerConfig(
            max_num_seqs=engine.max_num_seqs, max_num_batched_tokens=engine.max_num_batched_tokens,
            max_model_len=max_model_len, enable_chunked_prefill=engine.enable_chunked_prefill,
            long_prefill_token_threshold=engine.long_prefill_token_threshold, policy=engine.scheduling_policy,
            async_scheduling=engine.async_scheduling, num_speculative_tokens=num_speculative_tokens,
            # A proposer with a model writes its KV past the chunk before the next step (vLLM's lookahead slots;
            # engine/runner/spec_decode/draft_model.py), so its requests hold that many more slots.
            num_lookahead_tokens=num_speculative_tokens if num_speculative_tokens and
            engine.speculative_decoding.drafts_with_a_model else 0,
            max_loras=engine.max_loras)
    except ValueError as error:
        # The one scheduler field the workload spells differently (vLLM's engine argument's name).
        raise _named("engine", ValueError(str(error).replace("scheduler.policy", "engine.scheduling_policy")
                                          .replace("cache.eviction_policy", "engine.prefix_cache_eviction_policy"))) from None
    try:
        cost_model = load_cost_model(cost_model_spec, model, hardware, workload.dtype, engine.tensor_parallel_size,
                                     engine.kv_cache_dtype, quantization, engine.pipeline_parallel_size,
                                     expert_parallel_ranks)
    except (ValueError, OSError) as error:
        message = str(error)
        own_field = message.startswith(("engine.", "hardware."))
        raise (SetupError(message) if own_field else _named("cost_model", error)) from None
    if engine.async_scheduling and not hasattr(cost_model, "pipeline_stage_times"):
        raise SetupError("engine.async_scheduling: true needs the analytical cost model; a calibrated profile's "
                         "step times hold the engine's own overhead, which async scheduling would overlap")
    speculation = None
    if num_speculative_tokens:
        section = engine.speculative_decoding
        try:  # what an n-gram lookup costs, and whether the cost model can price the drafts at all
            lookup_s = ngram_lookup_cost(cost_model, section)
        except ValueError as error:
            raise SetupError(str(error)) from None
        # The MTP module is the model's own layer, quantized as the model is; a separate draft model is not.
        draft_cost_model = None if draft_model is None else AnalyticalCostModel(
            draft_model, hardware, workload.dtype, engine.tensor_parallel_size, engine.kv_cache_dtype,
            quantization=quantization if section.method == "mtp" else None,
            # The MTP module's experts are spread over the ranks' GPUs as the model's are.
            data_parallel_size=expert_parallel_ranks if section.method == "mtp" else 1)
        speculation = SpeculationSetup(num_speculative_tokens, tuple(section.acceptance_by_position()), section.method,
                                       workload.seed, draft_cost_model,
                                       proposal_by_position=tuple(section.proposal_by_position()),
                                       ngram_propose_s_per_request=lookup_s)
    try:
        price_expert_popularity(workload, model, [cost_model] + (
            [speculation.draft_cost_model] if speculation is not None and speculation.method == "mtp" else []))
    except ValueError as error:
        raise SetupError(str(error)) from None
    lora = _lora(workload, model, hardware, cost_model)
    try:
        vision = vision_setup(workload, model, cost_model)
    except VisionSetupError as error:
        raise SetupError(str(error)) from None
    if requests is None:
        requests = generate_requests(workload, vocab_size=model.vocab_size, model_max_len=max_model_len,
                                     tokens_per_image=None if vision is None else vision.tokens_per_image)
    if vision is not None:
        scheduler_config = size_encoder_budget(scheduler_config, workload, requests, vision.encoder)
    return RunSetup(workload, model, hardware, scheduler_config, cache_config, cost_model, requests, host_link,
                    speculation, lora, vision)


def _hybrid_groups(workload: WorkloadConfig, model: ModelShape, draft_model: ModelShape | None) -> KVCacheGrouping | None:
    """vLLM's hybrid KV cache for a model mixing windowed (or chunked) and full layers, unless the workload turns it
    off. KV offloading and disaggregated prefill and decode turn it off, as vLLM's KV connectors (and this engine's
    real runs, for offloading) do; pipeline parallelism and a draft model are not simulated with it (refused by
    name: vLLM groups a draft's layers with the target's, which this pool model does not)."""
    engine = workload.engine
    uses_connector = engine.kv_offloading_size_gib > 0 or workload.cluster.prefill_replicas > 0
    groups = None if engine.disable_hybrid_kv_cache_manager or uses_connector else hybrid_kv_cache_groups(model)
    if groups is None:
        return None
    clashes = [(name, value, why) for name, value, why in (
        ("engine.pipeline_parallel_size", engine.pipeline_parallel_size - 1 and engine.pipeline_parallel_size,
         "pipeline parallelism"),
        ("engine.speculative_decoding.draft_model", draft_model is not None and draft_model.name, "a draft model"),
    ) if value]
    if clashes:
        name, value, why = clashes[0]
        raise SetupError(f"{name}: {value!r}: {why} is not simulated with the hybrid KV cache that model "
                         f"{model.name!r} gets (its layers mix "
                         f"{'chunked' if model.attention_chunk_size else 'sliding-window'} and full attention); set "
                         "engine.disable_hybrid_kv_cache_manager=true to keep every layer's KV in one table")
    return groups


def _lora(workload: WorkloadConfig, model: ModelShape, hardware: HardwareSpec, cost_model: CostModel
          ) -> LoRASetup | None:
    """The adapters' slots and load times for workload.lora (None without adapters), refusing what the simulator
    does not model with them; prices their kernels in the analytical cost model. A calibrated profile prices
    them only if it was fitted on LoRA runs, and its fitted load costs replace the hardware's (calibrated_lora.py)."""
    adapters = workload.lora_adapters()
    if not adapters:
        return None
    engine, where = workload.engine, workload.lora_sections()[0][0]
    refused = [(engine.pipeline_parallel_size > 1, f"engine.pipeline_parallel_size {engine.pipeline_parallel_size}"),
               (engine.async_scheduling, "engine.async_scheduling: true"),
               (workload.cluster.disaggregated, f"cluster.prefill_replicas {workload.cluster.prefill_replicas}"),
               (engine.speculative_decoding is not None and engine.speculative_decoding.num_speculative_tokens > 0,
                "engine.speculative_decoding")]
    for refuse, setting in refused:
        if refuse:
            raise SetupError(f"{where}: LoRA adapters are not simulated with {setting}; set one of them back")
    load_costs = None
    if isinstance(cost_model, CalibratedCostModel):
        try:
            notes = check_profile_prices_lora(cost_model.profile, cost_model.path or "(inline)", where, workload)
        except ValueError as error:
            raise SetupError(str(error)) from None
        for note in notes:
            warnings.warn(note, stacklevel=2)
        load_costs = cost_model.profile.lora_loads
    elif not isinstance(cost_model, AnalyticalCostModel):
        raise SetupError(f"{where}: LoRA adapters need the analytical cost model or a calibrated profile fitted on "
                         f"LoRA runs; the cost model {cost_model.name} has no term for their kernels")
    specs = list(adapters.values())
    try:
        setup = lora_setup(specs, model, hardware, workload.dtype, engine.tensor_parallel_size, engine.max_loras,
                           engine.cpu_lora_capacity(), engine.max_lora_rank, load_costs)
    except ValueError as error:
        raise SetupError(str(error)) from None
    if isinstance(cost_model, AnalyticalCostModel):
        cost_model.price_lora(engine.max_lora_rank, specs[0].target_modules)
    return setup


def _drafts_with_mtp(workload: WorkloadConfig) -> bool:
    section = workload.engine.speculative_decoding
    return section is not None and section.method == "mtp"


def _speculative_decoding(workload: WorkloadConfig, model: ModelShape) -> tuple[int, ModelShape | None]:
    """engine.speculative_decoding's drafts per step (0: off) and its draft model (method draft_model, the model's
    MTP module for method mtp, its EAGLE head for eagle and eagle3), refusing
    what the simulator does not model with it."""
    section = workload.engine.speculative_decoding
    if section is None or section.num_speculative_tokens == 0:
        return 0, None
    engine, field_name = workload.engine, "engine.speculative_decoding"
    tokens = section.num_speculative_tokens
    if engine.async_scheduling:
        # The core refuses it too: a batch in flight would sample before its drafts were verified.
        raise SetupError(f"{field_name}: num_speculative_tokens {tokens} cannot run with engine.async_scheduling: "
                         "true (the next batch would be scheduled before this one's drafts are verified); set "
                         "engine.async_scheduling=false or engine.speculative_decoding=null")
    if engine.pipeline_parallel_size > 1:
        raise SetupError(f"{field_name}: num_speculative_tokens {tokens} is not simulated with pipeline parallelism "
                         f"(engine.pipeline_parallel_size {engine.pipeline_parallel_size}); set one of them back")
    if workload.cluster.disaggregated:
        raise SetupError(f"{field_name}: num_speculative_tokens {tokens} is not simulated in a disaggregated cluster "
                         f"(cluster.prefill_replicas {workload.cluster.prefill_replicas}); set one of them back")
    if section.method == "ngram":
        return tokens, None
    if section.method == "mtp":
        try:
            return tokens, mtp_draft_shape(model)
        except ValueError as error:
            raise SetupError(f"{field_name}.{error}") from None
    if section.method in EAGLE_METHODS:
        try:
            return tokens, eagle_draft_shape(model, section.method, section.draft_vocab_size,
                                             _head_config(section.draft_model))
        except (ValueError, OSError) as error:
            raise SetupError(f"{field_name}.{error}") from None
    try:
        draft_model = resolve_model(section.draft_model)
        draft_model.shard(engine.tensor_parallel_size)
    except (ValueError, OSError) as error:
        raise SetupError(f"{field_name}.draft_model: {error}") from None
    if draft_model.vocab_size != model.vocab_size:
        raise SetupError(f"{field_name}.draft_model: {section.draft_model!r} has a vocabulary of "
                         f"{draft_model.vocab_size:,} tokens, model {model.name!r} one of {model.vocab_size:,}; a draft "
                         "model must share the target's tokenizer")
    return tokens, draft_model


def _head_config(draft_model: str | None) -> dict | None:
    """An EAGLE head checkpoint's config.json (``draft_model``: its folder or the file), None without one."""
    if draft_model is None:
        return None
    import json
    from pathlib import Path

    path = Path(draft_model)
    path = path if path.name == "config.json" else path / "config.json"
    if not path.is_file():
        raise ValueError(f"draft_model: {draft_model!r} has no config.json (an EAGLE head's checkpoint folder)")
    return json.loads(path.read_text())


def _kv_offloading(workload: WorkloadConfig, model: ModelShape, hardware: HardwareSpec
                   ) -> tuple[int, HostLinkSetup | None]:
    """The host tier's size in blocks and its link, for engine.kv_offloading_size_gib (0 and None without)."""
    engine = workload.engine
    size_gib = engine.kv_offloading_size_gib
    if not size_gib:
        return 0, None
    field_name = "engine.kv_offloading_size_gib"
    # A disaggregated decode engine's loads are its prefill engines' KV: each would take the other's for its own.
    if workload.cluster.disaggregated:
        raise SetupError(f"{field_name}: {size_gib:g} GiB is not simulated in a disaggregated cluster "
                         f"(cluster.prefill_replicas {workload.cluster.prefill_replicas})")
    if hardware.host_link_bandwidth_gbps is None:
        raise SetupError(f"{field_name}: hardware {hardware.name!r} names no host link to load offloaded KV over; "
                         "set hardware.host_link_bandwidth_gbps")
    storage_dtype = kv_cache_storage_dtype(workload.dtype, engine.kv_cache_dtype)
    bytes_per_token = model.kv_bytes_per_token(storage_dtype)
    num_blocks = offload_capacity_blocks(size_gib, bytes_per_token * engine.block_size)
    if num_blocks < 1:
        raise SetupError(f"{field_name}: {size_gib:g} GiB holds no block of {model.name!r}'s KV "
                         f"({bytes_per_token * engine.block_size:,} bytes each)")
    if num_blocks * BYTES_PER_SIMULATED_HOST_BLOCK > MAX_SIMULATED_POOL_BYTES:
        raise SetupError(f"{field_name}: {size_gib:g} GiB is {num_blocks:,} blocks of {model.name!r}'s KV, more than "
                         "this process keeps track of; set a smaller size")
    # Each tensor-parallel GPU moves its own shard over its own link, all at once.
    shard_bytes = bytes_per_token / engine.tensor_parallel_size
    return num_blocks, HostLinkSetup(shard_bytes, hardware.host_link_bandwidth_gbps * HOST_LINK_EFFICIENCY)
