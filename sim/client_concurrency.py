"""A client that keeps at most ``workload.max_concurrency`` requests in flight (vLLM's ``bench serve --max-concurrency``).

A request whose arrival finds every slot taken waits at the client, in arrival order, and is sent the moment a
request in flight finishes; its arrival time becomes that moment, the time the engine first sees it (so its
latencies count from there, as the benchmark's do). Every driver (the simulator, the wall-clock driver of a real
run and of its replay) passes arrivals and finishes through this object in time order, so all of them send the
same requests at the same logical times.

Invariant: ``in_flight`` <= ``limit``, and a request waits only while ``in_flight == limit``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

from workloads import RequestSpec


class ConcurrencyLimit:
    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {limit}")
        self.limit = limit
        self.in_flight = 0
        self.waiting: deque[RequestSpec] = deque()

    def offer(self, spec: RequestSpec) -> RequestSpec | None:
        """``spec`` arrived: the request to send now (``spec`` itself), or None when it must wait for a slot."""
        if self.in_flight < self.limit:
            self.in_flight += 1
            return spec
        self.waiting.append(spec)
        return None

    def on_finished(self, time: float) -> RequestSpec | None:
        """A request in flight finished at ``time``: the waiting request sent in its place, arriving at ``time``."""
        self.in_flight -= 1
        if not self.waiting:
            return None
        spec = self.waiting.popleft()
        self.in_flight += 1
        return replace(spec, arrival_time=time, client_wait_s=spec.client_wait_s + time - spec.arrival_time)
