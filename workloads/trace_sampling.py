"""Which trace rows a workload uses, and when they arrive.

Two cases:

- Trace arrivals (``arrival.type: trace``): rows are taken in time order from ``start_offset``; times
  are shifted so the first request arrives at 0 and multiplied by ``trace.time_scale``, or rescaled so
  the mean rate, (n - 1) / (last - first), equals ``arrival.rate``. With ``num_requests`` the rate is
  measured over the requests actually replayed; with ``duration_s``, over the whole usable trace.
- Synthetic arrivals with trace lengths: ``sequential`` takes rows in file order, and
  ``random_with_replacement`` draws row indices uniformly from the usable rows (its own random stream).
"""

from __future__ import annotations

import numpy as np

from workloads.arrivals import MAX_GENERATED_REQUESTS, ArrivalProcess, TraceArrival
from workloads.errors import Problem, WorkloadError
from workloads.sections import TraceSection


def trace_arrivals(
    arrival: TraceArrival,
    trace: TraceSection,
    num_requests: int | None,
    duration_s: float | None,
) -> tuple[np.ndarray, np.ndarray]:
    """(arrival times from 0, the trace rows they belong to), in arrival order."""
    rows = trace.pool_rows()
    raw_times = trace.records().arrival_times[rows]
    order = np.argsort(raw_times, kind="stable")
    rows, relative = rows[order], raw_times[order] - raw_times[order][0]
    if num_requests is not None:
        rows, relative = rows[:num_requests], relative[:num_requests]
    scale = trace.time_scale
    if arrival.rate is not None:
        span = float(relative[-1])
        if len(relative) < 2 or span <= 0:
            raise WorkloadError(
                Problem(
                    "workload.arrival.rate",
                    "cannot rescale a trace whose selected requests all arrive at once",
                    arrival.rate,
                )
            )
        observed_rate = (len(relative) - 1) / span
        scale = observed_rate / arrival.rate
    times = relative * scale
    if duration_s is not None:
        keep = times < duration_s
        rows, times = rows[keep], times[keep]
    return times, rows


def synthetic_arrivals(
    arrival: ArrivalProcess,
    seed_stream: np.random.SeedSequence,
    num_requests: int | None,
    duration_s: float | None,
) -> np.ndarray:
    """Arrival times for ``num_requests`` requests, or for every arrival before ``duration_s``."""
    if num_requests is not None:
        return arrival.arrival_times(np.random.default_rng(seed_stream), num_requests)
    assert duration_s is not None
    expected = arrival.mean_rate() * duration_s
    count = int(expected + 6 * expected**0.5) + 16
    while True:
        if count > MAX_GENERATED_REQUESTS:
            raise WorkloadError(
                Problem(
                    "workload.duration_s",
                    f"would generate more than {MAX_GENERATED_REQUESTS:,} requests at a mean rate of "
                    f"{arrival.mean_rate():g}/s; shorten it or use num_requests",
                    duration_s,
                )
            )
        # A fresh generator from the same seed each try: the result depends only on the config.
        times = arrival.arrival_times(np.random.default_rng(seed_stream), count)
        if times[-1] >= duration_s:
            return times[times < duration_s]
        count *= 2


def select_rows(trace: TraceSection, count: int, rng: np.random.Generator) -> np.ndarray:
    """The trace rows whose lengths ``count`` synthetic arrivals take."""
    pool = trace.pool_rows()
    if trace.sample == "random_with_replacement":
        return pool[rng.integers(0, len(pool), size=count)]
    if count > len(pool):
        raise WorkloadError(
            Problem(
                "workload.trace.sample",
                f"sequential sampling has {len(pool)} trace rows for {count} requests; use random_with_replacement",
                trace.sample,
            )
        )
    return pool[:count]
