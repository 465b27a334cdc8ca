"""Downsampling keeps what a reader looks for: exact tails of CDFs, spikes of step series, the
slowest requests of a timeline sample, while bounding what the page has to draw."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.dashboard.downsample import (
    CDF_BODY_LEVELS,
    CDF_EXACT_TAIL_SAMPLES,
    CDF_TAIL_LEVELS,
    binned_sum,
    cdf_points,
    min_max_indices,
    nice_bin_width,
    percentile,
    sample_indices,
    time_bin_edges,
)
from analysis.dashboard.timeline_figure import request_phases, sample_requests


def test_cdf_is_bounded_and_keeps_the_exact_tail() -> None:
    values = np.random.default_rng(0).lognormal(3.0, 1.0, 1_000_000)
    points = cdf_points(values)
    limit = CDF_BODY_LEVELS + CDF_TAIL_LEVELS + CDF_EXACT_TAIL_SAMPLES + 10
    assert points.values.size <= limit and points.count == values.size
    ordered = np.sort(values)
    assert points.values[-1] == ordered[-1] and points.fractions[-1] == 1.0  # the maximum, exactly
    assert points.values[0] == ordered[0]
    # The slowest samples are drawn exactly, each at its own rank.
    assert np.isin(ordered[-CDF_EXACT_TAIL_SAMPLES:], points.values).all()
    for level in (50, 90, 99, 99.9):
        # The percentile markers (numpy's linear interpolation, as the summary) lie on the curve.
        index = np.flatnonzero(np.isclose(points.fractions, level / 100.0))
        assert index.size == 1
        assert np.isclose(points.values[index[0]], percentile(values, level))
    assert np.all(np.diff(points.values) >= 0) and np.all(np.diff(points.fractions) > 0)


def test_small_cdfs_draw_every_sample_and_ignore_nan() -> None:
    points = cdf_points(np.array([3.0, np.nan, 1.0, 2.0]))
    np.testing.assert_array_equal(points.values, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(points.fractions, [0.0, 0.5, 1.0])
    assert cdf_points(np.array([np.nan])).count == 0
    assert percentile(np.array([]), 50) is None


def test_min_max_decimation_keeps_one_step_spikes() -> None:
    times = np.arange(100_000) * 0.01
    values = np.zeros(100_000)
    values[54_321] = 500.0
    values[77_777] = -3.0
    keep = min_max_indices(times, values, buckets=1000)
    assert keep.size <= 2 * 1000 + 2
    assert {54_321, 77_777, 0, 99_999} <= set(keep.tolist())
    assert np.all(np.diff(keep) > 0)
    short = min_max_indices(times[:50], values[:50], buckets=1000)
    np.testing.assert_array_equal(short, np.arange(50))


def test_time_bins_are_round_and_cover_the_span() -> None:
    assert nice_bin_width(100.0) == 0.5
    assert nice_bin_width(3000.0) == 20.0
    edges = time_bin_edges(0.3, 101.7)
    assert edges[0] <= 0.3 and edges[-1] >= 101.7
    counts = binned_sum(np.array([0.3, 50.0, 101.7, np.nan]), None, edges)
    assert counts.sum() == 3


def test_samples_are_bounded_deterministic_and_keep_the_requested_points() -> None:
    keep = sample_indices(10_000, 200, always_keep=np.array([9_999, 5, 7_777]))
    assert keep.size <= 203 and {5, 7_777, 9_999} <= set(keep.tolist())
    np.testing.assert_array_equal(keep, sample_indices(10_000, 200, always_keep=np.array([9_999, 5, 7_777])))


def test_timeline_sample_always_includes_the_slowest_requests() -> None:
    count = 5_000
    arrival = np.arange(count, dtype=np.float64)
    e2e = np.full(count, 1.0)
    slowest = [13, 1_001, 4_443]
    e2e[slowest] = 100.0
    requests = pd.DataFrame({
        "request_id": [f"r{index}" for index in range(count)], "arrival_time": arrival,
        "scheduled_time": arrival + 0.1, "first_token_time": arrival + 0.2, "finish_time": arrival + e2e,
    })
    sample = sample_requests(requests, limit=100, slowest=5)
    assert len(sample) <= 100
    assert set(f"r{index}" for index in slowest) <= set(sample["request_id"])
    assert sample["arrival_time"].is_monotonic_increasing


def test_request_phases_handle_requests_that_never_ran() -> None:
    requests = pd.DataFrame({
        "arrival_time": [0.0, 1.0], "scheduled_time": [0.5, np.nan], "first_token_time": [0.7, np.nan],
        "finish_time": [2.0, 3.0],
    })
    phases = request_phases(requests)
    np.testing.assert_array_equal(phases["waiting"][1], [0.5, 3.0])  # aborted while waiting
    assert np.isnan(phases["prefill"][1][1]) and np.isnan(phases["decode"][0][1])
    np.testing.assert_array_equal(phases["decode"][0], [0.7, np.nan])
