"""The cluster's autoscaler (``cluster.autoscaling``, workloads/autoscaling_section.py) as a SimPy process.

Every replica of the cluster exists from the start (``cluster.num_replicas`` engines: the most that may run);
the autoscaler decides which of them serve. Each replica is in one state:
- ``ready``: routable; the router chooses among the ready replicas only;
- ``starting``: powered and billed, not routable until ``startup_s`` after the decision that started it;
- ``draining``: scaled down while it held requests: it finishes them, takes no new one, then stops;
- ``off``.

Invariants: at least ``min_replicas`` replicas are ready or starting, and at least one is ready (a request
always has somewhere to go); a starting, draining or off replica holds no request it was routed after the
decision that took it out (a draining one finishes what it held); the billed time of a replica is the union
of its powered stretches (starting, ready, draining), up to the run's end.

Decisions (every ``interval_s`` from t = interval_s): the metric is summed over the ready replicas, read live
from their schedulers (a scrape of their ``/metrics``); desired = ceil(sum / target), clamped to
[min_replicas, num_replicas]. Nothing changes while sum / (target x current) is within ``tolerance`` of 1
(current: ready + starting, as HPA counts pods). A larger desired count is applied at once; a smaller one only
as the largest count desired over the last ``scale_down_delay_s`` (HPA's stabilization window).

Scale-up takes draining replicas back first (warm: ready at once, the one drained last first), then starts off
ones (the lowest index first). Scale-down cancels starting replicas first (the last started first: they have
served nothing), then drains the ready replicas with the fewest outstanding requests (ties: the highest index).

The decisions read the replicas' state, so a decode fast-forward stops at each (``next_decision_time``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import simpy

from engine.core import EngineCore
from workloads.autoscaling_section import AutoscalingSection

READY, STARTING, DRAINING, OFF = "ready", "starting", "draining", "off"


@dataclass
class ScalingEvent:
    """The cluster after a decision or a transition: what the timeline plots."""

    time_s: float
    ready: int
    powered: int     # ready + starting + draining: what is billed
    desired: int | None = None  # set on decisions
    metric: float | None = None  # the metric's sum over the ready replicas, on decisions


@dataclass
class AutoscalingStats:
    end_s: float        # the run's end (its last event), to which powered replicas are billed
    replica_seconds: float
    peak_powered: int
    scale_ups: int      # replicas started or taken back
    scale_downs: int    # replicas drained or cancelled
    events: list[ScalingEvent] = field(default_factory=list)
    transitions: list[tuple[float, int, str]] = field(default_factory=list)  # Autoscaler.transitions

    def summary(self, num_replicas: int, gpus_per_replica: int, section: AutoscalingSection) -> dict:
        """The run summary's ``autoscaling`` entry. ``static_replica_hours``: what ``num_replicas`` replicas
        serving from t = 0 to the run's end bill, the cluster without an autoscaler."""
        run_end_s = self.end_s
        static_s = num_replicas * run_end_s
        return {
            "metric": section.metric,
            "target": section.target,
            "replica_hours": self.replica_seconds / 3600,
            "gpu_hours": self.replica_seconds * gpus_per_replica / 3600,
            "static_replica_hours": static_s / 3600,
            "saved_fraction": 1 - self.replica_seconds / static_s if static_s > 0 else None,
            "mean_replicas": self.replica_seconds / run_end_s if run_end_s > 0 else None,
            "peak_replicas": self.peak_powered,
            "scale_ups": self.scale_ups,
            "scale_downs": self.scale_downs,
            # After every decision and every replica ready or stopped: a step function of time.
            "timeline": {
                "time_s": [event.time_s for event in self.events],
                "ready": [event.ready for event in self.events],
                "powered": [event.powered for event in self.events],
                "desired": [event.desired for event in self.events],
                "metric": [event.metric for event in self.events],
            },
        }


def desired_replicas(metric_sum: float, section: AutoscalingSection, current: int, max_replicas: int) -> int:
    """The count this decision asks for before the scale-down window: ``current`` within tolerance, else
    ceil(metric_sum / target) clamped to [min_replicas, max_replicas]."""
    if current > 0 and abs(metric_sum / (section.target * current) - 1) <= section.tolerance:
        return current
    # A float sum such as 3 x 0.1 / 0.1 lands a hair above 3; what differs by rounding alone asks for no replica.
    wanted = math.ceil(metric_sum / section.target - 1e-9)
    return min(max(wanted, section.min_replicas), max_replicas)


class Autoscaler:
    def __init__(self, env: simpy.Environment, section: AutoscalingSection, engines: Sequence[EngineCore]) -> None:
        self.env = env
        self.section = section
        self.engines = list(engines)
        start = section.replicas_at_start
        self.state = [READY if index < start else OFF for index in range(len(self.engines))]
        # Every change of a replica's state, in time order: (time, replica, new state). What the tests check the
        # invariants on, and a record of which replica served when.
        self.transitions: list[tuple[float, int, str]] = [(0.0, index, state) for index, state in enumerate(self.state)]
        # When each replica was last powered on (None: off); billed time so far for stretches already ended.
        self._powered_since: list[float | None] = [0.0 if index < start else None for index in range(len(self.engines))]
        self._billed_s = 0.0
        # Each starting replica's pending start, so that a cancelled start does not turn it ready later.
        self._start_generation = [0] * len(self.engines)
        # Replicas in the order they were drained (the last drained is taken back first).
        self._drained_order: list[int] = []
        self._recent_desired: deque[tuple[float, int]] = deque()
        self.next_decision_time = section.interval_s
        self.scale_ups = 0
        self.scale_downs = 0
        self.peak_powered = start
        self.events: list[ScalingEvent] = [ScalingEvent(0.0, start, start)]
        self._refresh_routable()

    # What the simulator reads.

    def _refresh_routable(self) -> None:
        self.routable = [index for index, state in enumerate(self.state) if state == READY]

    def count(self, state: str) -> int:
        return sum(1 for each in self.state if each == state)

    @property
    def num_powered(self) -> int:
        return sum(1 for each in self.state if each != OFF)

    def run(self, done: Callable[[], bool]):
        """Decide every interval_s until ``done()`` (no request will be routed any more)."""
        while not done():
            yield self.env.timeout(self.next_decision_time - self.env.now)
            if done():
                break
            self.decide()
            self.next_decision_time = self.env.now + self.section.interval_s
        self.next_decision_time = math.inf

    def on_idle(self, index: int) -> None:
        """Replica ``index`` has no work left: a draining replica stops."""
        if self.state[index] == DRAINING:
            self._power_off(index)
            self._record()

    def stats(self, end_time: float) -> AutoscalingStats:
        """Billed replica-seconds up to ``end_time`` (the run's end), and the timeline."""
        billed = self._billed_s + sum(end_time - since for since in self._powered_since if since is not None)
        return AutoscalingStats(end_time, billed, self.peak_powered, self.scale_ups, self.scale_downs, list(self.events),
                                list(self.transitions))

    # Decisions.

    def metric(self, index: int) -> float:
        scheduler = self.engines[index].scheduler
        metric = self.section.metric
        if metric == "outstanding":
            return self._outstanding(index)
        if metric == "waiting":
            return len(scheduler.waiting)
        return scheduler.kv_cache_manager.usage

    def decide(self) -> None:
        now = self.env.now
        metric_sum = sum(self.metric(index) for index in self.routable)
        current = self.count(READY) + self.count(STARTING)
        desired = desired_replicas(metric_sum, self.section, current, len(self.engines))
        window = self._recent_desired
        window.append((now, desired))
        while window and window[0][0] < now - self.section.scale_down_delay_s:
            window.popleft()
        if desired > current:
            self._scale_up(desired - current)
        else:
            floor = max(count for _, count in window)
            if floor < current:
                self._scale_down(current - floor)
        # A draining replica already idle stops now (it may have had nothing to finish).
        for index, state in enumerate(self.state):
            if state == DRAINING and not self.engines[index].has_work():
                self._power_off(index)
        self._record(desired, metric_sum)

    def _scale_up(self, count: int) -> None:
        for _ in range(count):
            if self._drained_order:
                index = self._drained_order.pop()
                self._set(index, READY)  # warm: its weights are loaded
            else:
                index = self.state.index(OFF)
                self._set(index, STARTING)
                self._powered_since[index] = self.env.now
                self._start_generation[index] += 1
                self.env.process(self._start(index, self._start_generation[index]))
            self.scale_ups += 1
        self.peak_powered = max(self.peak_powered, self.num_powered)
        self._refresh_routable()

    def _start(self, index: int, generation: int):
        yield self.env.timeout(self.section.startup_s)
        if self.state[index] == STARTING and self._start_generation[index] == generation:
            self._set(index, READY)
            self._refresh_routable()
            self._record()

    def _scale_down(self, count: int) -> None:
        starting = [index for index, state in enumerate(self.state) if state == STARTING]
        starting.sort(key=lambda index: self._powered_since[index])
        while count and starting:
            self._power_off(starting.pop())
            self.scale_downs += 1
            count -= 1
        # Never the last ready replica: a request always needs one (min_replicas >= 1 keeps one anyway, unless
        # the only others were starting).
        while count and self.count(READY) > 1:
            ready = [index for index, state in enumerate(self.state) if state == READY]
            index = min(ready, key=lambda index: (self._outstanding(index), -index))
            self._set(index, DRAINING)
            self._drained_order.append(index)
            self.scale_downs += 1
            count -= 1
        self._refresh_routable()

    def _outstanding(self, index: int) -> int:
        scheduler = self.engines[index].scheduler
        return len(scheduler.waiting) + len(scheduler.running)

    def _power_off(self, index: int) -> None:
        self._billed_s += self.env.now - self._powered_since[index]
        self._powered_since[index] = None
        if index in self._drained_order:
            self._drained_order.remove(index)
        self._set(index, OFF)

    def _set(self, index: int, state: str) -> None:
        self.state[index] = state
        self.transitions.append((self.env.now, index, state))

    def _record(self, desired: int | None = None, metric: float | None = None) -> None:
        self.events.append(ScalingEvent(self.env.now, self.count(READY), self.num_powered, desired, metric))
