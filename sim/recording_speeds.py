"""A step-time fit with one speed per recording: the model's shape from every recording, its level from some.

A shared machine drifts: the same schedule recorded an hour or a day apart runs several percent (on one
campaign, up to 25%) slower or faster as a whole. Fitted together, such recordings teach the model the
day's speed along with the costs, and a term that one day's recordings exercise more than another's
picks up that day's speed as if it were that term's cost. Here each recording ``r`` gets a speed
``s_r``, and a step of it is modelled as ``s_r * f(features)``: the fit alternates between ``f`` on
durations divided by their recording's speed, and each speed as its recording's measured total over
``f``'s total on its fitted steps (the total, because latency sums step times). The speeds are
normalized so that those of the ``level`` recordings average 1: the profile then predicts the machine
as it ran during those recordings (by default, all of them), with a shape learned from all.

Invariant: the held-out steps are the same as a plain fit's (same seed, same split), and each is priced
at its own recording's speed, so the held-out error judges the shape, not the drift.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sim.calibration_fit import FitResult, fit_candidate, fit_step_model, held_out_split

# The alternation stops when no speed moves by more than this between rounds (0.01%), or after MAX_ROUNDS.
SPEED_TOLERANCE = 1e-4
MAX_ROUNDS = 20


def fit_with_recording_speeds(features: pd.DataFrame, level_recordings: list[int] | None = None, *,
                              held_out_fraction: float = 0.2, seed: int = 0,
                              fixed: dict[str, float] | None = None) -> tuple[FitResult, np.ndarray]:
    """``features`` as ``fit_step_model`` takes them, with a ``recording`` column (0..n-1).
    ``level_recordings``: the recordings whose speeds average 1 (default: all). Returns the fit (its
    held-out errors at each step's recording speed) and the speed of each recording."""
    recording = features["recording"].to_numpy(int)
    num_recordings = int(recording.max()) + 1
    level = sorted(set(range(num_recordings) if level_recordings is None else level_recordings))
    if not level or level[0] < 0 or level[-1] >= num_recordings:
        raise ValueError(f"the level recordings {level_recordings} are not among the {num_recordings} recordings")
    if num_recordings < 2:
        raise ValueError("a speed per recording needs at least two recordings")
    train_rows, _ = held_out_split(len(features), held_out_fraction, seed)
    in_train = np.zeros(len(features), dtype=bool)
    in_train[train_rows] = True
    durations = features["duration"].to_numpy(float)
    speeds = np.ones(num_recordings)
    # The candidate structure (knots, small-batch offsets) is chosen on held-out steps once at the start and
    # once at the end; the rounds between refit that structure only (one fit each instead of dozens).
    chosen = fit_step_model(features, held_out_fraction=held_out_fraction, seed=seed, fixed=fixed)
    knots: dict[str, list[float]] = {}
    for hinge in chosen.hinges:
        knots.setdefault(hinge["feature"], []).append(hinge["knot"])
    offsets = list(chosen.token_count_offsets_s)
    for _ in range(MAX_ROUNDS):
        at_speed = features.assign(duration=durations / speeds[recording])
        predicted = fit_candidate(at_speed.iloc[train_rows], knots, offsets, fixed).predict(features)
        measured_total = np.bincount(recording[in_train], durations[in_train], num_recordings)
        predicted_total = np.bincount(recording[in_train], predicted[in_train], num_recordings)
        if (predicted_total <= 0).any():
            raise ValueError("a recording has no fitted steps to measure its speed by: record longer runs")
        updated = measured_total / predicted_total
        updated /= updated[level].mean()
        converged = np.abs(updated / speeds - 1).max() < SPEED_TOLERANCE
        speeds = updated
        if converged:
            break
    fit = fit_step_model(features.assign(duration=durations / speeds[recording]),
                         held_out_fraction=held_out_fraction, seed=seed, fixed=fixed)
    return fit, speeds
