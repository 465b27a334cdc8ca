"""Build the real engine for a workload: the model runner as executor, the workload's engine limits.

Imported only when a real run is asked for (it loads torch). The engine's scheduler and cache
configuration come from the workload's ``engine:`` section exactly as in a simulated run; the model
is the given checkpoint (default: the project's generated "small" model), not the workload's
simulated ``model:`` preset, which names a shape for the cost model.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass, field

from engine.core import EngineCore
from sim.engine_setup import SetupError
from sim.real_images import RealImages, check_real_run_images
from workloads import WorkloadConfig


@dataclass
class RealEngine:
    engine: EngineCore
    vocab_size: int
    reserved_token_ids: list[int]
    info: dict
    # LoRA workloads: each adapter's folder (sim/real_lora_adapters.py) and the runner's LoRA manager, whose
    # counters the run records per step; empty and None otherwise.
    lora_paths: dict[str, str] = field(default_factory=dict)
    lora_manager: object = None
    # A checkpoint whose images the engine encodes (sim/real_images.py); None: a text model.
    images: RealImages | None = None


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def empty_prefix_cache(engine: EngineCore, what: str) -> None:
    """Forget every cached prefix and the cache's statistics and put the free blocks back in a fresh
    pool's order, so that the next requests see what a fresh engine (and the simulator) would: the same
    scheduling decisions and the same physical blocks. ``what`` (the warm-up, the speed probe) is named
    in the error when requests or KV blocks are still held."""
    scheduler = engine.scheduler
    manager = scheduler.kv_cache_manager
    if engine.has_work() or not scheduler.reset_prefix_cache() or not manager.block_pool.restore_free_order():
        raise RuntimeError(f"{what} left requests or KV blocks in use")
    manager.make_prefix_cache_stats()


def _warm_up(llm) -> None:
    """Run a few requests before the clock starts, as a serving engine does at start-up.

    The first forward passes pay one-time costs (allocator growth, lazy initialisation, kernel
    selection) that would otherwise land on the workload's first steps and distort its trace. The
    prefix cache is emptied afterwards, so the workload starts from the state a fresh engine has as
    far as any scheduling decision can tell.
    """
    from engine.core import SamplingParams

    vocab = llm.model_runner.vocab_size
    params = SamplingParams(max_tokens=4, ignore_eos=True, temperature=0.0)
    # Cut to the longest sequence the engine serves (max_model_len, the KV capacity), or an engine that
    # serves less than the longest warm-up prompt would refuse its own warm-up.
    limit = llm.engine_core.scheduler.max_model_len
    lengths = [max(1, min(length, limit - params.max_tokens)) for length in (8, 96, 300, 40, 17)]
    prompts = [[(7 * index + 3 * length) % vocab for index in range(length)] for length in lengths]
    # A batch, then one request alone: kernels compiled for the shapes of both (on a GPU, Triton and
    # cuBLAS pick per shape; a first compilation inside a measured step would cost it half a second).
    llm.generate(prompts[:4], params, use_tqdm=False)
    llm.generate(prompts[4:], params, use_tqdm=False)
    empty_prefix_cache(llm.engine_core, "warm-up")
    llm.engine_core.scheduler.num_preemptions_total = 0


def real_draft_model(value: str) -> str:
    """The checkpoint a real run drafts with, from ``engine.speculative_decoding.draft_model``: the generated default
    models by name (``tiny``, ``small``; the presets ``servesim-tiny`` / ``servesim-small`` price them), or a folder
    (or its config.json) that holds the weights too."""
    from pathlib import Path

    name = value.removeprefix("servesim-")
    if name in ("tiny", "small"):
        return name
    path = Path(value)
    folder = path.parent if path.name == "config.json" else path
    if not (folder / "config.json").is_file() or not any(folder.glob("*.safetensors")):
        raise SetupError(f"engine.speculative_decoding.draft_model: {value!r} names no checkpoint (a folder with "
                         "config.json and safetensors weights) for a real run; the presets are priced, not loaded "
                         "(use tiny or small, or a checkpoint folder)")
    return str(folder)


def build_real_engine(workload: WorkloadConfig, *, model: str | None = None, device: str = "cpu",
                      dtype: str = "auto", attention_backend: str | None = None, threads: int = 1,
                      enforce_eager: bool = False) -> RealEngine:
    if workload.engine.data_parallel_size > 1:
        raise SetupError(f"engine.data_parallel_size: {workload.engine.data_parallel_size} ranks run in the simulator "
                         "only; a real run uses one device (set engine.data_parallel_size=1)")
    if workload.engine.tensor_parallel_size > 1:
        raise SetupError(f"engine.tensor_parallel_size: {workload.engine.tensor_parallel_size} GPUs per engine run in "
                         "the simulator only; a real run uses one device (set engine.tensor_parallel_size=1)")
    if workload.engine.pipeline_parallel_size > 1:
        raise SetupError(f"engine.pipeline_parallel_size: {workload.engine.pipeline_parallel_size} stages run in the "
                         "simulator only; a real run uses one device (set engine.pipeline_parallel_size=1)")
    if workload.engine.async_scheduling:
        raise SetupError("engine.async_scheduling: true is simulated only; the real runner runs one step at a time "
                         "(set engine.async_scheduling=false)")
    if workload.engine.quantization is not None:
        raise SetupError(f"engine.quantization: {workload.engine.quantization!r} is simulated only; the real runner "
                         "loads the model's own weights (set engine.quantization=null)")
    if workload.engine.kv_cache_dtype != "auto":
        raise SetupError(f"engine.kv_cache_dtype: {workload.engine.kv_cache_dtype!r} is simulated only; the real "
                         "runner keeps its cache in the model's dtype (set engine.kv_cache_dtype=auto)")
    if workload.engine.kv_offloading_size_gib:
        raise SetupError(f"engine.kv_offloading_size_gib: {workload.engine.kv_offloading_size_gib:g} GiB is not "
                         "recorded in real runs: the runner copies host blocks within a step, which the simulator, "
                         "timing loads over the host link, could not replay (engine.LLM(kv_offloading_size_gib=...) "
                         "runs it; set engine.kv_offloading_size_gib=0 here)")
    speculative = workload.engine.speculative_decoding
    speculative_config = None
    if speculative is not None and speculative.num_speculative_tokens:
        if speculative.method == "mtp":
            raise SetupError("engine.speculative_decoding.method: 'mtp' is simulated only; the real runner has no "
                             "multi-token-prediction module (set engine.speculative_decoding.method=ngram or "
                             "draft_model)")
        if speculative.method in ("eagle", "eagle3") and speculative.draft_model is None:
            raise SetupError(f"engine.speculative_decoding.draft_model: method {speculative.method!r} needs the "
                             "head's checkpoint folder in a real run (the simulation prices the head from the "
                             "target's shape without one)")
        # The real proposer's drafts are accepted as often as the model agrees: acceptance_rate is what the
        # simulation assumes, the real run measures it (summary.json's spec_decoding).
        speculative_config = {"method": speculative.method, "num_speculative_tokens": speculative.num_speculative_tokens}
        if speculative.method == "ngram":
            speculative_config.update(prompt_lookup_min=speculative.prompt_lookup_min,
                                      prompt_lookup_max=speculative.prompt_lookup_max)
        else:
            speculative_config["model"] = real_draft_model(speculative.draft_model)
    num_replicas = workload.cluster.num_replicas
    if workload.cluster.disaggregated:
        # Checked first: the advice below would otherwise lead to prefill_replicas' own error.
        raise SetupError(f"cluster.prefill_replicas: {workload.cluster.prefill_replicas} prefill replicas (disaggregated "
                         "prefill and decode) run in the simulator only; the real executor has no KV connector (set "
                         "cluster.prefill_replicas=0 and cluster.num_replicas=1)")
    if num_replicas > 1:
        # Checked before torch is imported: a real run drives one engine in this process.
        raise SetupError(f"cluster.num_replicas: {num_replicas} replicas run in the simulator only; a real run "
                         "drives one engine (set cluster.num_replicas=1, or send the workload to a deployment "
                         "with --executor server)")
    import torch

    from engine.engine_args import DEFAULT_MODEL_NAMES
    from engine.llm import LLM

    generated = str(workload.model).lower().removeprefix("servesim-")
    if model is None and workload.has_images() and generated in ("tiny-llava", "small-llava"):
        model = generated  # a workload with images on a generated LLaVA runs on that model, not the text default

    if not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
    if device == "cpu":
        # One thread: steady, reproducible step times on a shared machine (and what calibration assumes).
        torch.set_num_threads(threads)
    section = workload.engine
    llm = LLM(model=model, dtype=dtype, device=device, block_size=section.block_size,
              enable_prefix_caching=section.enable_prefix_caching, max_num_seqs=section.max_num_seqs,
              max_num_batched_tokens=section.max_num_batched_tokens, max_model_len=section.max_model_len,
              num_gpu_blocks=section.num_gpu_blocks, enable_chunked_prefill=section.enable_chunked_prefill,
              long_prefill_token_threshold=section.long_prefill_token_threshold, attention_backend=attention_backend,
              seed=workload.seed, scheduling_policy=section.scheduling_policy,
              gpu_memory_utilization=section.gpu_memory_utilization, enforce_eager=enforce_eager,
              speculative_config=speculative_config, enable_lora=section.max_loras > 0,
              disable_hybrid_kv_cache_manager=section.disable_hybrid_kv_cache_manager,
              max_loras=max(section.max_loras, 1), max_lora_rank=section.max_lora_rank,
              max_cpu_loras=section.cpu_lora_capacity() if section.max_loras else None,
              max_num_encoder_input_tokens=section.max_num_encoder_input_tokens,
              encoder_cache_size=section.encoder_cache_size, disable_chunked_mm_input=section.disable_chunked_mm_input)
    images = RealImages(llm.image_inputs) if llm.image_inputs is not None else None
    check_real_run_images(workload, images)  # before the warm-up and the adapters: a refusal costs nothing more
    lora_paths = {}
    if workload.lora_adapters():
        from engine.models.default_model import cache_root
        from sim.real_lora_adapters import write_workload_adapters

        # Before the warm-up, which must not run with a run's adapter: the host cache starts empty, as a real
        # run's adapters are read from disk when its first request of each runs.
        lora_paths = write_workload_adapters(workload, llm.engine_args.resolve_model_path(), cache_root())
    _warm_up(llm)
    runner = llm.model_runner
    reserved = sorted(set(llm.tokenizer.all_special_ids)) if llm.tokenizer is not None else []
    hardware = cpu_name() + (f" ({threads} thread{'s' if threads > 1 else ''})" if device == "cpu" else "")
    if device != "cpu":
        hardware = torch.cuda.get_device_name(runner.device)
    model_path = llm.engine_args.resolve_model_path()
    # A generated default model is named as the simulator's presets name it, so profiles match.
    model_name = f"servesim-{model or 'small'}" if model is None or model in DEFAULT_MODEL_NAMES else str(model_path)
    info = {"kind": "real", "model": model_name, "model_path": str(model_path), "device": str(runner.device),
            "dtype": str(runner.dtype).removeprefix("torch."), "attention_backend": runner.attention_backend,
            "hardware": hardware, "threads": threads if device == "cpu" else None, "torch": torch.__version__,
            "cuda_graphs": runner.decode_graphs is not None}
    if images is not None:
        info["tokens_per_image"] = images.tokens_per_image  # None: each image's own
    return RealEngine(llm.engine_core, runner.vocab_size, reserved, info, lora_paths, runner.lora, images)
