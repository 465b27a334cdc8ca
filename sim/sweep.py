"""A sweep: every point of ``sweep:`` run as its own simulation, optionally in parallel processes.

Each point writes its own run directory ``<out>/<label>/``; the points' headline metrics go to
``<out>/sweep.csv`` so a latency-throughput curve is one pandas call away.
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from analysis.disaggregation_stats import TTFT_PARTS
from analysis.replica_stats import billed_replicas
from sim.engine_setup import SetupError, build_setup
from sim.run_pipeline import run_simulation
from workloads import WorkloadConfig

SWEEP_TABLE_COLUMNS = (
    "request_throughput", "output_token_throughput", "goodput", "slo_attainment", "num_preemptions",
    "prefix_cache_hit_rate", "kv_usage_mean", "replica_load_imbalance",
)


@dataclass
class SweepPointResult:
    label: str
    summary: dict
    out_dir: Path


def _run_point(label: str, point: WorkloadConfig, out_dir: Path, cost_model, progress: bool,
               fast_forward: bool = True) -> SweepPointResult:
    result = run_simulation(point, out_dir, cost_model=cost_model, progress=progress, fast_forward=fast_forward)
    return SweepPointResult(label, result.summary, out_dir)


def run_sweep(workload: WorkloadConfig, out_dir: Path, *, cost_model=None, jobs: int = 1,
              progress: bool = False, fast_forward: bool = True) -> list[SweepPointResult]:
    points = workload.sweep_points()
    if len(points) > 1:
        # Every point's engine is set up (without its requests) before any runs: a point that cannot be
        # simulated is refused before the others have spent their time.
        for label, point in points:
            try:
                build_setup(point, cost_model, requests=[])
            except SetupError as error:
                raise SetupError(f"sweep point {label}: {error}") from None
    directories = [out_dir / _safe_label(label) for label, _ in points]
    if jobs > 1 and len(points) > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(_run_point, label, point, directory, cost_model, False, fast_forward)
                       for (label, point), directory in zip(points, directories)]
            results = [future.result() for future in futures]
    else:
        results = [_run_point(label, point, directory, cost_model, progress, fast_forward)
                   for (label, point), directory in zip(points, directories)]
    write_sweep_table(results, out_dir / "sweep.csv")
    return results


def write_sweep_table(results: list[SweepPointResult], path: Path) -> pd.DataFrame:
    rows = []
    disaggregated = any(result.summary.get("disaggregation") for result in results)
    speculating = any(result.summary.get("spec_decoding") for result in results)
    serving_lora = any(result.summary.get("lora") for result in results)
    with_sessions = any(result.summary.get("sessions") for result in results)
    with_images = any(result.summary.get("multimodal") for result in results)
    autoscaled = any(result.summary.get("autoscaling") for result in results)
    for result in results:
        row = {"point": result.label, "run_dir": str(result.out_dir)}
        row.update({name: result.summary.get(name) for name in SWEEP_TABLE_COLUMNS})
        for metric in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms"):
            for stat in ("p50", "p90", "p99"):
                row[f"{metric}_{stat}"] = (result.summary.get(metric) or {}).get(stat)
        # What the point bills, to set beside its SLO attainment: an autoscaled cluster's replica-hours, else
        # every configured replica for the whole run.
        if autoscaled:
            row["replica_hours"], row["mean_replicas"], row["peak_replicas"] = billed_replicas(result.summary)
        # KV offloading: the share of prompt tokens loaded from host memory (empty without it).
        row["offload_loaded_token_fraction"] = (result.summary.get("kv_offload") or {}).get("loaded_token_fraction")
        if with_sessions:  # multi-turn sessions: how much of the later turns' history the cache held
            later = (result.summary.get("sessions") or {}).get("later_turns") or {}
            row["later_turns_cached_fraction"] = later.get("cached_fraction")
            row["later_turns_ttft_ms_p90"] = later.get("ttft_ms_p90")
        if serving_lora:  # multi-LoRA serving: adapter loads and their share of step time (empty where it is off)
            lora = result.summary.get("lora") or {}
            row["lora_adapter_loads"] = lora.get("adapter_loads")
            row["lora_load_share"] = lora.get("load_share_of_step_time")
        if with_images:  # images: what the encoder computed, and what its cache and the prefix cache saved it
            images = result.summary.get("multimodal") or {}
            row["images_encoded"] = images.get("images_encoded")
            row["encoder_tokens_saved_fraction"] = images.get("encoder_tokens_saved_fraction")
        if speculating:
            # Speculative decoding: tokens per verification and accepted share of drafts (empty where it is off).
            spec = result.summary.get("spec_decoding") or {}
            row["spec_acceptance_length"] = spec.get("mean_acceptance_length")
            row["spec_acceptance_rate"] = spec.get("acceptance_rate")
        for name, stats in (result.summary.get("by_class") or {}).items():
            # Per request class (workload.classes), under its own SLO; a class name holds no dot, so
            # "interactive.ttft_ms_p90" cannot meet a run-level column's name.
            row[f"{name}.slo_attainment"] = stats.get("slo_attainment")
            for metric in ("ttft_ms", "e2e_ms"):
                row[f"{name}.{metric}_p90"] = (stats.get(metric) or {}).get("p90")
        if disaggregated:
            # The parts of TTFT (analysis.disaggregation_stats); empty for a point whose replicas do both.
            parts = result.summary.get("disaggregation") or {}
            for key, _, _ in TTFT_PARTS:
                for stat in ("mean", "p90"):
                    row[f"{key}_{stat}"] = (parts.get(key) or {}).get(stat)
        rows.append(row)
    table = pd.DataFrame(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(path, index=False)
    return table


def _safe_label(label: str) -> str:
    return "".join(character if character.isalnum() or character in "._=-" else "_" for character in label)
