"""What loading a LoRA adapter costs, fitted from real runs' recorded slot fills.

A real run of a LoRA workload records per step the adapters it copied into device slots
(``num_lora_loads``), how many of them it read from disk first (``num_lora_disk_loads``) and the seconds both
took (``lora_load_s``, part of the step's duration). The simulator prices a load as a copy of the adapter into
its slot, plus a read of its file when the host cache does not hold it (sim/lora_adapters.py), so a step's
load seconds are modelled as two non-negative terms, in one of two forms:

- ``per_byte``: seconds per adapter byte copied into a slot and per byte read from disk (what the hardware's
  bandwidths price; an adapter's bytes come from its shape and the model: ``adapter_bytes``);
- ``per_load``: seconds per slot fill and per disk read, whatever the adapter's size (on a CPU a load may be
  dominated by opening and parsing the file and by one copy call per matrix).

Both are fitted on the same random 80% of the steps with loads and judged on the rest (median relative error);
``per_load`` is kept only if it wins clearly (2%). Recordings whose adapters all have one size cannot tell the
two apart (their errors are equal): ``per_byte`` is then kept, since it scales with an adapter's size as a
bandwidth does and a fixed cost would not.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.optimize import nnls

LOAD_KINDS = ("per_byte", "per_load")
HELD_OUT_FRACTION = 0.2
# Fewer steps with loads than this and the two forms are not compared: per_byte is fitted on all of them.
MIN_LOAD_STEPS_TO_COMPARE = 10


@dataclass(frozen=True)
class LoadCosts:
    """``copy_s`` and ``disk_read_s``: seconds per byte (kind per_byte) or per load (per_load)."""

    kind: str
    copy_s: float
    disk_read_s: float

    def seconds(self, adapter_bytes: float, from_disk: bool) -> float:
        """One load of an adapter of ``adapter_bytes`` bytes (read from disk first when ``from_disk``)."""
        scale = adapter_bytes if self.kind == "per_byte" else 1.0
        return scale * (self.copy_s + (self.disk_read_s if from_disk else 0.0))

    def to_dict(self) -> dict:
        return {"kind": self.kind, "copy_s": self.copy_s, "disk_read_s": self.disk_read_s}


@dataclass
class LoadFit:
    costs: LoadCosts
    errors: dict[str, float]  # per kind: median |relative error| on held-out load steps (on all without a split)
    num_load_steps: int
    num_held_out_steps: int

    def summary(self) -> dict:
        return {"kind": self.costs.kind, "num_load_steps": self.num_load_steps,
                "num_held_out_load_steps": self.num_held_out_steps, "median_ape_by_kind": dict(self.errors)}


def _columns(steps: pd.DataFrame, kind: str) -> np.ndarray:
    loads, disk = steps["num_lora_loads"].to_numpy(float), steps["num_lora_disk_loads"].to_numpy(float)
    if kind == "per_byte":
        size = steps["adapter_bytes"].to_numpy(float)
        return np.column_stack([loads * size, disk * size])
    return np.column_stack([loads, disk])


def _fit(steps: pd.DataFrame, kind: str) -> LoadCosts:
    """Non-negative least squares on relative error (each row over its measured seconds)."""
    design, seconds = _columns(steps, kind), steps["lora_load_s"].to_numpy(float)
    scaled = design / seconds[:, None]
    column_scale = np.maximum(np.abs(scaled).max(axis=0), 1e-30)
    solution = nnls(scaled / column_scale, np.ones(len(seconds)))[0] / column_scale
    solution = np.where(design.any(axis=0), solution, 0.0)  # no disk read recorded: no cost for one
    return LoadCosts(kind, float(solution[0]), float(solution[1]))


def _median_error(costs: LoadCosts, steps: pd.DataFrame) -> float:
    design = _columns(steps, costs.kind)
    predicted = design @ np.array([costs.copy_s, costs.disk_read_s])
    measured = steps["lora_load_s"].to_numpy(float)
    return float(np.median(np.abs(predicted - measured) / measured))


def fit_load_costs(steps: pd.DataFrame, *, seed: int = 0) -> LoadFit | None:
    """``steps``: recorded steps with ``num_lora_loads``, ``num_lora_disk_loads``, ``lora_load_s`` and
    ``adapter_bytes`` (the bytes of one adapter of the step's recording). None when no step loaded."""
    steps = steps[(steps["num_lora_loads"] > 0) & (steps["lora_load_s"] > 0)].reset_index(drop=True)
    if steps.empty:
        return None
    if len(steps) < MIN_LOAD_STEPS_TO_COMPARE:
        costs = _fit(steps, "per_byte")
        return LoadFit(costs, {"per_byte": _median_error(costs, steps)}, len(steps), 0)
    order = np.random.default_rng(seed).permutation(len(steps))
    cut = int(len(steps) * (1 - HELD_OUT_FRACTION))
    train, held_out = steps.iloc[order[:cut]], steps.iloc[order[cut:]]
    fits = {kind: _fit(train, kind) for kind in LOAD_KINDS}
    errors = {kind: _median_error(costs, held_out) for kind, costs in fits.items()}
    kind = "per_load" if errors["per_load"] < errors["per_byte"] * 0.98 else "per_byte"
    # The kept form refitted on every step with loads: the split only chose it.
    return LoadFit(_fit(steps, kind), errors, len(steps), len(held_out))
