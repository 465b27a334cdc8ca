"""Arrival processes: when requests reach the server, selected in YAML by ``type``.

Synthetic processes produce the first ``count`` arrival times, starting at t = 0 (the first request
arrives when the run starts, as in vLLM's benchmark_serving). Scaling is linear in ``1 / rate``:
inter-arrival gaps are drawn for rate 1 and divided by the rate, so a sweep over rates stretches one
and the same pattern of gaps instead of drawing a new one at each point.

``trace`` replays the trace's own times (see trace_sampling.py); its optional ``rate`` rescales them to
a target mean rate.
"""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt

from workloads.schema_base import SchemaModel

# Guards against a duration far beyond what memory can hold at the configured rate (a mistyped duration_s).
MAX_GENERATED_REQUESTS = 5_000_000


class ArrivalProcess(SchemaModel):
    def mean_rate(self) -> float:
        """Requests per second in the long run."""
        raise NotImplementedError

    def arrival_times(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """The first ``count`` arrival times in seconds, non-decreasing, the first at 0."""
        raise NotImplementedError


def _times_from_gaps(gaps: np.ndarray) -> np.ndarray:
    # The first request arrives at 0; gap i separates request i from request i + 1.
    times = np.zeros(len(gaps))
    np.cumsum(gaps[:-1], out=times[1:])
    return times


class PoissonArrival(ArrivalProcess):
    """Exponential gaps: independent users, the classic open-loop benchmark load."""

    type: Literal["poisson"]
    rate: PositiveFloat

    def mean_rate(self) -> float:
        return self.rate

    def arrival_times(self, rng: np.random.Generator, count: int) -> np.ndarray:
        return _times_from_gaps(rng.standard_exponential(count) / self.rate)


class GammaArrival(ArrivalProcess):
    """Gamma gaps with coefficient of variation ``cv``: cv > 1 is burstier than Poisson, cv < 1 smoother.

    vLLM's benchmark calls the shape parameter "burstiness" (= 1 / cv^2); we take the cv, the number
    people measure on traces.
    """

    type: Literal["gamma"]
    rate: PositiveFloat
    cv: PositiveFloat

    def mean_rate(self) -> float:
        return self.rate

    def arrival_times(self, rng: np.random.Generator, count: int) -> np.ndarray:
        shape = 1.0 / self.cv**2
        # standard_gamma(shape) has mean `shape`; dividing by shape * rate makes the mean gap 1 / rate.
        return _times_from_gaps(rng.standard_gamma(shape, count) / (shape * self.rate))


class ConstantArrival(ArrivalProcess):
    """Evenly spaced requests, ``1 / rate`` apart: no queueing from arrival noise at all."""

    type: Literal["constant"]
    rate: PositiveFloat

    def mean_rate(self) -> float:
        return self.rate

    def arrival_times(self, rng: np.random.Generator, count: int) -> np.ndarray:
        return np.arange(count, dtype=np.float64) / self.rate


class BurstArrival(ArrivalProcess):
    """Bursts of ``burst_size`` requests every ``burst_interval_s`` seconds over Poisson background traffic.

    The first burst starts at t = 0. Requests of one burst arrive together, or spread uniformly over
    ``burst_spread_s`` seconds. ``rate`` is the background Poisson rate between bursts (0: bursts only),
    so the mean rate is ``rate + burst_size / burst_interval_s``.
    """

    type: Literal["bursts"]
    rate: NonNegativeFloat = 0.0
    burst_size: PositiveInt
    burst_interval_s: PositiveFloat
    burst_spread_s: NonNegativeFloat = 0.0

    def mean_rate(self) -> float:
        return self.rate + self.burst_size / self.burst_interval_s

    def arrival_times(self, rng: np.random.Generator, count: int) -> np.ndarray:
        # Enough bursts alone to reach `count`, and `count` background arrivals: the first `count` of
        # their union are then exactly the first `count` arrivals of the superposed process.
        num_bursts = -(-count // self.burst_size)
        burst_starts = np.repeat(np.arange(num_bursts) * self.burst_interval_s, self.burst_size)
        burst_times = burst_starts + rng.random(len(burst_starts)) * self.burst_spread_s
        times = burst_times
        if self.rate > 0:
            background = np.cumsum(rng.standard_exponential(count) / self.rate)
            times = np.concatenate([burst_times, background])
        return np.sort(times, kind="stable")[:count]


class AtOnceArrival(ArrivalProcess):
    """Every request arrives when the run starts: vLLM's ``--request-rate inf``. With ``workload.max_concurrency``
    it is a closed loop: that many clients, each sending its next request when its last one finished."""

    type: Literal["at_once"]

    def mean_rate(self) -> float:
        return float("inf")

    def arrival_times(self, rng: np.random.Generator, count: int) -> np.ndarray:
        return np.zeros(count)


class TraceArrival(ArrivalProcess):
    """The trace's own arrival times, shifted to start at 0.

    ``rate`` (optional) rescales them so that the mean rate of the replayed requests equals it, keeping
    the trace's pattern of gaps; ``workload.trace.time_scale`` is the other way to speed a trace up.
    """

    type: Literal["trace"]
    rate: PositiveFloat | None = None

    def mean_rate(self) -> float:
        raise TypeError("a trace's rate depends on the trace; see trace_sampling.trace_arrivals")


ArrivalSpec = Annotated[
    PoissonArrival | GammaArrival | ConstantArrival | BurstArrival | AtOnceArrival | TraceArrival,
    Field(discriminator="type"),
]
