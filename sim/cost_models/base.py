"""The contract between the simulator's engine loop and a cost model, and the factory that picks one.

The engine loop asks ``step_time`` once per engine step; ``describe`` goes into ``summary.json`` so
that every simulated run records which model, and which figures, timed it.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Protocol, runtime_checkable

from sim.cost_models.step_batch import StepBatch, StepFeatures
from sim.hardware import HardwareSpec, resolve_hardware
from sim.model_presets import resolve_model
from sim.model_shapes import ModelShape


@runtime_checkable
class CostModel(Protocol):
    name: str

    def step_time(self, batch: StepBatch) -> float:
        """Seconds for the whole engine step (forward + sampling + fixed overhead)."""
        ...

    def step_time_from_features(self, features: StepFeatures) -> float:
        """``step_time`` for a caller that already derived the step's features (once per step)."""
        ...

    def describe(self) -> dict:
        """JSON-safe description for summary.json."""
        ...


def load_cost_model(spec: str | dict | None, model: ModelShape, hardware: HardwareSpec, dtype: str,
                    tensor_parallel_size: int = 1, kv_cache_dtype: str = "auto",
                    quantization: str | None = None, pipeline_parallel_size: int = 1,
                    data_parallel_size: int = 1) -> CostModel:
    """``None`` or ``"analytical"``: the roofline model for ``model`` on ``hardware`` (on
    ``tensor_parallel_size`` of them). A path ending in ``.json``: a calibrated step profile (measured on
    one device, so refused with tensor parallelism). A mapping: ``{"kind": "analytical"}``,
    ``{"kind": "calibrated", "path": "..."}``, or a whole profile inline (it has a ``"format"`` key).
    """
    from sim.cost_models.analytical import AnalyticalCostModel
    from sim.cost_models.calibrated import CalibratedCostModel, StepProfile

    model = resolve_model(model)
    hardware = resolve_hardware(hardware)
    if spec is None or spec == "analytical":
        return AnalyticalCostModel(model, hardware, dtype, tensor_parallel_size, kv_cache_dtype, quantization,
                                   pipeline_parallel_size, data_parallel_size)
    if isinstance(spec, Path) or (isinstance(spec, str) and spec.endswith(".json")):
        calibrated = CalibratedCostModel.from_file(spec)
    elif isinstance(spec, str):
        raise ValueError(f"cost_model: expected 'analytical' or a path to a .json step profile, got {spec!r}")
    elif isinstance(spec, dict):
        if "format" in spec:
            calibrated = CalibratedCostModel(StepProfile.from_dict(spec, source="cost_model (inline)"))
        else:
            kind = spec.get("kind")
            allowed = {"analytical": {"kind"}, "calibrated": {"kind", "path"}}.get(kind)
            if allowed is None:
                raise ValueError(f"cost_model.kind must be 'analytical' or 'calibrated', got {kind!r}")
            for key in spec:
                if key not in allowed:
                    raise ValueError(f"cost_model: unknown key {key!r} for kind {kind!r} "
                                     f"(keys: {', '.join(sorted(allowed))})")
            if kind == "analytical":
                return AnalyticalCostModel(model, hardware, dtype, tensor_parallel_size, kv_cache_dtype, quantization,
                                           pipeline_parallel_size, data_parallel_size)
            if not isinstance(spec.get("path"), str):
                raise ValueError(f"cost_model.path must name a .json step profile, got {spec.get('path')!r}")
            calibrated = CalibratedCostModel.from_file(spec["path"])
    else:
        raise ValueError(f"cost_model: expected None, 'analytical', a .json path or a mapping, got {spec!r}")
    if tensor_parallel_size != 1:
        # A profile's step times are one engine's on the device it was recorded on; no factor turns them
        # into another parallelism's (the all-reduces are not in them).
        raise ValueError(f"engine.tensor_parallel_size: {tensor_parallel_size} needs the analytical cost model; "
                         "a calibrated profile is measured on one device")
    if pipeline_parallel_size != 1:
        raise ValueError(f"engine.pipeline_parallel_size: {pipeline_parallel_size} needs the analytical cost model; "
                         "a calibrated profile is measured on one device")
    if data_parallel_size != 1:
        raise ValueError(f"engine.data_parallel_size: {data_parallel_size} needs the analytical cost model; a "
                         "calibrated profile is measured on one device")
    if quantization is not None:
        raise ValueError(f"engine.quantization: {quantization!r} needs the analytical cost model; a calibrated "
                         "profile is measured with the model's own weights")
    if kv_cache_dtype != "auto":
        raise ValueError(f"engine.kv_cache_dtype: {kv_cache_dtype!r} needs the analytical cost model; a calibrated "
                         "profile is measured with the model's own cache dtype")
    _warn_on_mismatch(calibrated.profile.provenance, model, hardware, dtype)
    return calibrated


def _warn_on_mismatch(provenance: dict, model: ModelShape, hardware: HardwareSpec, dtype: str) -> None:
    """A profile fitted on one model or device predicts nonsense for another; say so, but let the user
    decide (names differ harmlessly too: a Hugging Face id against a preset name)."""
    asked = {"model": model.name, "hardware": hardware.name, "dtype": dtype}
    for key, wanted in asked.items():
        fitted = str(provenance.get(key, ""))
        if key == "hardware" and hardware_matches(fitted, str(provenance.get("device", "")), wanted):
            continue
        if fitted.lower() != wanted.lower() and not fitted.lower().endswith("/" + wanted.lower()):
            warnings.warn(f"cost_model: the profile was fitted for {key} {fitted!r}, but this run uses {wanted!r}",
                          stacklevel=3)


def hardware_matches(fitted: str, fitted_device: str, preset: str) -> bool:
    """Whether a profile measured on ``fitted`` (a device name as the runtime reports it, e.g. "NVIDIA
    H200" or "AMD EPYC 7B13 (1 thread)") is the hardware a workload names by preset (``h200``, ``cpu``).

    The generic ``cpu`` preset stands for whatever CPU the profile was measured on; a GPU preset matches
    a device name that contains its chip (the part before the first dash: ``h100`` of ``h100-sxm``)."""
    preset = preset.lower()
    if fitted.lower() == preset:
        return True
    if preset == "cpu":
        return fitted_device.lower() == "cpu"
    chip = preset.split("-")[0]
    return chip in re.split(r"[^a-z0-9]+", fitted.lower())
