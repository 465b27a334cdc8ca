"""Where a calibrated profile was measured, and how far a simulated run strays beyond it.

A fitted step-time model is trustworthy inside the region its calibration steps covered and a guess
outside it: a linear term extrapolated from decode batches that read 20,000 KV tokens says little about
batches that read 48,000 (caches, kernel regimes). ``sim.calibrate`` records the largest value of each
feature among the calibration steps; after a simulated run, ``extrapolation_report`` counts the steps
that went past any of them and the share of simulated time they take, so a user sees when a what-if
leaves the measured region instead of trusting its figures blindly.
"""

from __future__ import annotations

import pandas as pd

# The features whose range is recorded: every count a profile's terms read (step-level switches such
# as has_prefill have no range to leave).
RANGE_FEATURES = ("num_tokens", "num_reqs", "num_prefill_reqs", "decode_context_tokens", "prefill_context_tokens",
                  "prefill_attention_work", "prefill_attention_dense_work", "context_prefill_dense_work",
                  "prefill_attention_sliced_work", "shared_context_tokens", "kv_block_runs", "num_lora_tokens",
                  "num_active_loras", "num_spec_tokens", "spec_attention_work", "num_spec_reqs",
                  "spec_context_tokens")


def calibrated_range(features: pd.DataFrame) -> dict[str, float]:
    """The largest value of each range feature among calibration steps (a feature table as
    ``sim.calibration_fit.step_feature_frame`` builds it). A feature that is zero in every step is left
    out: the runs did not record it (or never exercised it), and the fit gave it no cost."""
    return {name: float(features[name].max()) for name in RANGE_FEATURES
            if name in features.columns and features[name].max() > 0}


def extrapolation_report(features: pd.DataFrame, calibrated: dict[str, float]) -> dict:
    """How many of a run's steps (and how much of its step time) lie beyond the calibrated range, and
    per feature: the calibrated maximum, the run's maximum and the steps beyond it."""
    beyond_any = pd.Series(False, index=features.index)
    per_feature = {}
    for name, limit in calibrated.items():
        if name not in features.columns:
            continue
        beyond = features[name] > limit
        if beyond.any():
            per_feature[name] = {"calibrated_max": limit, "run_max": float(features[name].max()),
                                 "steps_beyond": int(beyond.sum())}
            beyond_any |= beyond
    total_time = float(features["duration"].sum())
    return {
        "num_steps": int(len(features)),
        "steps_beyond": int(beyond_any.sum()),
        "time_fraction_beyond": float(features.loc[beyond_any, "duration"].sum() / total_time) if total_time else 0.0,
        "features": per_feature,
    }


def describe_extrapolation(report: dict) -> str | None:
    """One line for a person, or None when every step lay inside the calibrated range."""
    if not report["steps_beyond"]:
        return None
    worst = sorted(report["features"].items(), key=lambda item: item[1]["run_max"] / max(item[1]["calibrated_max"], 1),
                   reverse=True)
    details = ", ".join(f"{name} up to {entry['run_max']:,.0f} (calibrated up to {entry['calibrated_max']:,.0f})"
                        for name, entry in worst[:3])
    return (f"{report['steps_beyond']} of {report['num_steps']} steps ({report['time_fraction_beyond']:.0%} of step "
            f"time) lie beyond the range the cost profile was calibrated on: {details}; their durations are "
            f"extrapolated")
