"""A LoRA workload simulated with a calibrated profile: whether the profile prices adapters, and their loads.

A profile fitted on LoRA runs (``sim.calibrate`` on recordings with adapter tokens) has compute terms for the
adapters (``num_lora_tokens``, ``num_active_loras``: the calibrated cost model reads them from each step's
features, fast-forwarded steps included) and, when some step loaded an adapter, the loads' fitted costs
(``lora_loads``), which replace the hardware's bandwidths. A profile fitted without adapters is refused, with
the commands that fit one.

The terms were measured with one adapter shape and one ``max_lora_rank`` (provenance ``lora``). A workload whose
adapters differ in rank or modules is refused: the terms are per token of the measured shape, and this
runner computes at each adapter's own rank, so another rank costs another amount the profile cannot tell.
A workload whose ``max_lora_rank`` alone differs is a warning: the runner's slots are sized for it, but its
kernels run at the adapters' ranks (engine/runner/lora/lora_linear.py), so the compute terms still apply;
only the slots' memory differs.

``sim.validate`` refuses a LoRA workload before recording it unless ``--profile`` names a profile fitted on LoRA
runs (``refuse_lora_without_profile``), and simulates a recorded LoRA run with the profile's adapter slots and
load costs (``simulated_lora``).
"""

from __future__ import annotations

from pathlib import Path

from sim.cost_models.calibrated import StepProfile, load_profile
from sim.hardware import resolve_hardware
from sim.lora_adapters import lora_setup
from sim.lora_steps import LoRASteps
from sim.model_presets import resolve_model
from sim.profile_match import SHIPPED_PROFILES_DIR

# The shipped CPU LoRA profile (never a default: named in the refusal of a LoRA run without --profile).
LORA_PROFILE = SHIPPED_PROFILES_DIR / "cpu-small-float32-lora.json"
HOW_TO_CALIBRATE = (
    "record a few real runs of a LoRA workload and fit one, e.g. `python -m sim.run multi_lora --executor real "
    "--model small --set model=small --set hardware=cpu --set dtype=float32 --set engine.max_model_len=2048 "
    "--set engine.max_num_batched_tokens=512 --set workload.num_requests=30 --set workload.lora.base_model_fraction=0.5 "
    "--out runs/lora-1` (and runs/lora-2, ... with other seeds, rates and max_loras; half the requests on the base "
    "model separate the adapters' cost from the machine's drift), then `python -m sim.calibrate runs/lora-1 runs/lora-2 runs/lora-3 "
    "-o lora-profile.json`")


def check_profile_prices_lora(profile: StepProfile, source: str, where: str, workload) -> list[str]:
    """Warnings for a LoRA ``workload`` simulated with ``profile``; a ValueError naming ``where`` (the workload's
    lora section) when the profile cannot price its adapters."""
    if not profile.prices_lora:
        raise ValueError(f"{where}: LoRA adapters need the analytical cost model or a profile fitted on LoRA runs; "
                         f"the calibrated profile {source} was fitted on steps without adapters and has no term for "
                         f"their kernels or loads: {HOW_TO_CALIBRATE}")
    measured = profile.provenance.get("lora", {})
    adapters = list(workload.lora_adapters().values())
    ranks = sorted({adapter.rank for adapter in adapters})
    modules = sorted({module for adapter in adapters for module in adapter.target_modules})
    if measured and (ranks != measured["adapter_ranks"] or modules != sorted(measured["target_modules"])):
        raise ValueError(f"{where}: adapters of rank {ranks} on {modules}; the profile {source} was fitted on "
                         f"adapters of rank {measured['adapter_ranks']} on {sorted(measured['target_modules'])}, and "
                         "its adapter terms are per token of that shape: fit a profile on runs of this shape")
    warnings = []
    rank = workload.engine.max_lora_rank
    if measured and rank != measured["max_lora_rank"]:
        warnings.append(f"engine.max_lora_rank {rank}: the profile {source} was fitted with {measured['max_lora_rank']}; "
                        "the real runner computes at the adapters' own rank (the same here), so only the slots' "
                        "memory differs")
    return warnings


def simulated_lora(workload, profile: StepProfile, source: str) -> LoRASteps | None:
    """A LoRA workload's adapter slots, their loads priced by the profile's fitted costs; None without adapters.
    A profile without adapter terms is refused (check_profile_prices_lora)."""
    adapters = list(workload.lora_adapters().values())
    if not adapters:
        return None
    check_profile_prices_lora(profile, source, workload.lora_sections()[0][0], workload)
    engine = workload.engine
    setup = lora_setup(adapters, resolve_model(workload.model), resolve_hardware(workload.hardware), workload.dtype,
                       engine.tensor_parallel_size, engine.max_loras, engine.cpu_lora_capacity(), engine.max_lora_rank,
                       profile.lora_loads)
    return LoRASteps(setup)


def refuse_lora_without_profile(workload, profile: Path | str | None) -> None:
    """Before recording a LoRA workload: a ValueError unless ``profile`` was fitted on LoRA runs (None, the
    default profiles, were not), saying how to fit one."""
    sections = workload.lora_sections()
    if not sections:
        return
    if profile is None:
        raise ValueError(f"{sections[0][0]}: a LoRA workload is compared by sim.validate only with --profile, a "
                         "profile fitted on LoRA runs (the default profiles have no term for adapters; "
                         f"sim/data/profiles/{LORA_PROFILE.name} is one for the small model on the CPU with rank-16 adapters on all seven "
                         f"projections): {HOW_TO_CALIBRATE}; then `python -m sim.validate WORKLOAD --profile "
                         "lora-profile.json`")
    check_profile_prices_lora(load_profile(profile), str(profile), sections[0][0], workload)
