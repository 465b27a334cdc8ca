"""A real run of a workload: the same request stream, replayed into an ``EngineCore`` whose executor
runs a model, at wall-clock arrival times; the same run directory as a simulated run.

Requests run with ``ignore_eos`` and ``max_tokens`` equal to their workload output length (as in the
simulator), so both modes produce exactly the same number of tokens per request. The summary keeps
everything a replay needs to rebuild the run: the workload, the resolved scheduler and cache
configuration, and the vocabulary the token ids were drawn from.
"""

from __future__ import annotations

import platform
import time
from pathlib import Path

import pandas as pd

from analysis import write_run
from engine.core import CacheConfig, EngineCore, SchedulerConfig
from sim.machine_load import MachineLoad
from sim.real_lora_steps import RealLoRASteps
from sim.run_pipeline import RunResult, summarize_traces
from sim.speed_probe import probe_summary, run_speed_probe, write_probe
from sim.wall_clock_driver import run_wall_clock
from sim.real_images import RealImages, check_real_run_images
from workloads import WorkloadConfig, generate_requests
from workloads.request_spec import count_requests


def real_run_config(workload: WorkloadConfig, scheduler_config: SchedulerConfig, cache_config: CacheConfig,
                    vocab_size: int, reserved_token_ids, executor_info: dict) -> dict:
    return {
        "workload": workload.to_dict(),
        "scheduler": {name: getattr(scheduler_config, name) for name in SchedulerConfig.__slots__},
        "cache": {name: getattr(cache_config, name) for name in CacheConfig.__slots__},
        "vocab_size": int(vocab_size),
        "reserved_token_ids": sorted(int(token) for token in reserved_token_ids),
        "executor": executor_info,
        "python": platform.python_version(),
    }


def run_real(workload: WorkloadConfig, out_dir: str | Path | None, engine: EngineCore, *, vocab_size: int,
             reserved_token_ids=(), executor_info: dict | None = None, progress: bool = False,
             speed_probe: bool = False, lora_paths: dict[str, str] | None = None, lora_manager=None,
             images: RealImages | None = None) -> RunResult:
    """``speed_probe``: time the fixed probe steps of ``sim/speed_probe.py`` before the first request and
    after the last (about 15 s on the CPU): the machine's speed around the run, which ``sim.validate``
    reports (and simulates at, with ``--at-probed-speed``). ``lora_paths`` and ``lora_manager``: a LoRA workload's
    adapter folders and the runner's LoRA manager (sim/real_engine.py's RealEngine has both). ``images``: the engine's
    image inputs, for a workload with images (sim/real_images.py)."""
    check_real_run_images(workload, images)
    tokens_per_image = images.tokens_per_image if images is not None and workload.has_images() else None
    requests = generate_requests(workload, vocab_size=vocab_size, reserved_token_ids=reserved_token_ids,
                                 model_max_len=engine.scheduler.scheduler_config.max_model_len,
                                 tokens_per_image=tokens_per_image)
    # Preprocessed before the clock starts (sim/real_images.py).
    image_pixels = images.pixels(requests) if images is not None and workload.has_images() else None
    probes = []
    if speed_probe:
        probes.append(run_speed_probe(engine, vocab_size=vocab_size, reserved_token_ids=reserved_token_ids,
                                      phase="before"))
    load = MachineLoad.start()
    started = time.perf_counter()
    lora_steps = RealLoRASteps(lora_manager) if lora_manager is not None and lora_paths else None
    recorder = run_wall_clock(engine, requests, progress=progress, description=f"{workload.name} (real)",
                              lora_paths=lora_paths, lora_steps=lora_steps,
                              max_concurrency=workload.workload.max_concurrency, image_pixels=image_pixels,
                              temperature=workload.workload.temperature)
    finished = time.perf_counter()
    cpu_run = (executor_info or {}).get("device") == "cpu"
    machine_load = load.summary(sum(recorder.step_columns()["duration"]) if cpu_run else None)
    if speed_probe:
        probes.append(run_speed_probe(engine, vocab_size=vocab_size, reserved_token_ids=reserved_token_ids,
                                      phase="after"))
    scheduler = engine.scheduler
    config = real_run_config(workload, scheduler.scheduler_config, scheduler.cache_config, vocab_size,
                             reserved_token_ids, executor_info or {"kind": type(engine.executor).__name__})
    if tokens_per_image:
        config["tokens_per_image"] = tokens_per_image  # the replay draws the same requests with it
    tables = summarize_traces(recorder, workload, config, mode="real")
    requests_table, steps_table, summary = tables
    summary["num_preemptions_scheduler"] = scheduler.num_preemptions_total
    summary["machine_load"] = machine_load
    if probes:
        probe_steps = pd.concat(probes, ignore_index=True)
        summary["speed_probe"] = probe_summary(probe_steps)
    if out_dir is not None:
        write_run(Path(out_dir), requests_table, steps_table, summary)
        if probes:
            write_probe(out_dir, probe_steps)
    return RunResult(summary, Path(out_dir) if out_dir else None, finished - started, finished - started,
                     count_requests(requests))


__all__ = ["real_run_config", "run_real"]
