"""Reduce long traces to what a browser can draw quickly, without hiding what matters.

A 10,000-request run has tens of thousands of steps and millions of inter-token gaps; a page that
ships them all is tens of megabytes and takes seconds to draw. Each kind of figure gets its own
reduction, chosen so that the reduced picture tells the same story:

- CDFs are evaluated at ~1,000 evenly spaced quantile levels, densely in the tail, and at the exact
  largest samples, so p99, p99.9 and the maximum are never interpolated away.
- Step series (one point per engine step) keep the minimum and the maximum of each time bucket
  (min/max decimation), so a queue spike or a KV-usage peak one step wide is still drawn.
- Rates over time (throughput, hit rate) are binned counts: an honest aggregate, not a sample.
- Scatter plots draw a deterministic sample that always includes the most extreme points.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Quantile levels of a CDF: evenly spaced, then denser where the tail lives.
CDF_BODY_LEVELS = 1000
CDF_TAIL_LEVELS = 200
# The largest samples are drawn exactly: they *are* the tail.
CDF_EXACT_TAIL_SAMPLES = 50

# Min/max decimation keeps two points per bucket, so a series ends with at most ~2x this many.
SERIES_BUCKETS = 1500

# Bins of a rate-over-time figure: enough to see a burst, few enough that each bin holds events.
TIME_BINS = 200


@dataclass
class CdfPoints:
    """A CDF ready to draw: value (x) at each cumulative fraction (y), both sorted ascending."""

    values: np.ndarray
    fractions: np.ndarray
    count: int


def finite(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values, dtype=np.float64)
    return values[np.isfinite(values)]


def cdf_points(
    values: np.ndarray,
    body_levels: int = CDF_BODY_LEVELS,
    tail_levels: int = CDF_TAIL_LEVELS,
    exact_tail_samples: int = CDF_EXACT_TAIL_SAMPLES,
) -> CdfPoints:
    """Sample the empirical CDF of `values` (NaN dropped) at a bounded number of points.

    Quantiles use numpy's default (linear) interpolation, as the run summary does, so a percentile
    marker computed by `percentile` lies exactly on the drawn curve. The level of the i-th smallest
    of n samples is i / (n - 1) under that convention, which is how the exact tail samples (and the
    minimum and maximum) are placed.
    """
    sorted_values = np.sort(finite(values))
    count = sorted_values.size
    if count == 0:
        return CdfPoints(np.empty(0), np.empty(0), 0)
    if count == 1:
        return CdfPoints(sorted_values.copy(), np.ones(1), 1)
    # Tail levels: log-spaced distance from 1, from 1e-2 (p99) down to one sample's worth.
    smallest_gap = max(1.0 / (count - 1), 1e-9)
    tail = 1.0 - np.geomspace(1e-2, smallest_gap, tail_levels) if smallest_gap < 1e-2 else np.empty(0)
    exact_ranks = np.arange(max(count - exact_tail_samples, 0), count)
    levels = np.unique(
        np.concatenate(
            [
                np.linspace(0.0, 1.0, body_levels + 1),
                tail,
                np.array([0.5, 0.9, 0.99, 0.999]),
                exact_ranks / (count - 1),
            ]
        )
    )
    if count <= levels.size:
        # Fewer samples than levels: every sample, exactly.
        return CdfPoints(sorted_values, np.arange(count) / (count - 1), count)
    positions = levels * (count - 1)
    # Snap positions that are a rounding error away from a sample onto it, so those samples (the
    # exact tail, the maximum) are drawn as themselves, not as an interpolation next to themselves.
    nearest = np.rint(positions)
    positions = np.unique(np.where(np.abs(positions - nearest) < 1e-6, nearest, positions))
    drawn = np.interp(positions, np.arange(count), sorted_values)
    return CdfPoints(drawn, positions / (count - 1), count)


def percentile(values: np.ndarray, level_percent: float) -> float | None:
    """numpy's linear-interpolation percentile of the finite values; None when there are none."""
    values = finite(values)
    if values.size == 0:
        return None
    return float(np.percentile(values, level_percent))


def min_max_indices(times: np.ndarray, values: np.ndarray, buckets: int = SERIES_BUCKETS) -> np.ndarray:
    """Indices (sorted) of the points to keep: per time bucket, the smallest and the largest value.

    NaN values are dropped. The first and last points are always kept so the series spans the run.
    A series no longer than 2 x buckets is returned whole.
    """
    times = np.asarray(times, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    known = np.flatnonzero(np.isfinite(times) & np.isfinite(values))
    if known.size <= 2 * buckets:
        return known
    known_times = times[known]
    start, stop = float(known_times.min()), float(known_times.max())
    width = (stop - start) / buckets or 1.0
    bucket = np.minimum(((known_times - start) / width).astype(np.int64), buckets - 1)
    # Sorted by (bucket, value): each bucket's first row is its minimum, its last row its maximum.
    order = np.lexsort((values[known], bucket))
    sorted_buckets = bucket[order]
    is_first = np.r_[True, sorted_buckets[1:] != sorted_buckets[:-1]]
    is_last = np.r_[sorted_buckets[1:] != sorted_buckets[:-1], True]
    keep = known[order[is_first | is_last]]
    return np.unique(np.concatenate([keep, known[[0, -1]]]))


def nice_bin_width(span_seconds: float, target_bins: int = TIME_BINS) -> float:
    """A round bin width (1, 2 or 5 x 10^k seconds) giving about `target_bins` bins over the span."""
    if not span_seconds > 0:
        return 1.0
    raw = span_seconds / target_bins
    magnitude = 10.0 ** math.floor(math.log10(raw))
    for multiple in (1.0, 2.0, 5.0, 10.0):
        if raw <= multiple * magnitude:
            return multiple * magnitude
    return 10.0 * magnitude


def time_bin_edges(start: float, stop: float, target_bins: int = TIME_BINS) -> np.ndarray:
    """Edges of round-width bins covering [start, stop]; at least one bin."""
    width = nice_bin_width(stop - start, target_bins)
    first = math.floor(start / width) * width
    count = max(int(math.ceil((stop - first) / width)), 1)
    # One more edge than needed so that `stop` itself falls inside the last bin.
    return first + width * np.arange(count + 2)


def binned_sum(times: np.ndarray, weights: np.ndarray | None, edges: np.ndarray) -> np.ndarray:
    """Sum of `weights` (1 each when None) of the events whose time falls in each bin."""
    times = np.asarray(times, dtype=np.float64)
    known = np.isfinite(times)
    weights = None if weights is None else np.asarray(weights, dtype=np.float64)[known]
    sums, _ = np.histogram(times[known], bins=edges, weights=weights)
    return sums.astype(np.float64)


def sample_indices(count: int, limit: int, always_keep: np.ndarray | None = None) -> np.ndarray:
    """Up to `limit` indices of range(count), evenly strided, plus `always_keep`; sorted, unique.

    Deterministic (no random state), so the same run always draws the same points.
    """
    if count <= limit:
        return np.arange(count)
    keep = np.asarray(always_keep if always_keep is not None else [], dtype=np.int64)
    remaining = max(limit - keep.size, 0)
    strided = np.linspace(0, count - 1, remaining).round().astype(np.int64) if remaining else keep[:0]
    return np.unique(np.concatenate([keep, strided]))


def extreme_indices(values: np.ndarray, how_many: int) -> np.ndarray:
    """Indices of the `how_many` largest finite values (the slowest requests, the worst errors)."""
    values = np.asarray(values, dtype=np.float64)
    known = np.flatnonzero(np.isfinite(values))
    if known.size <= how_many:
        return known
    largest = np.argpartition(values[known], known.size - how_many)[known.size - how_many:]
    return known[largest]
