"""The request side of a wall-clock run (sim/wall_clock_driver.py): what to add to the engine before each step.

Three sources, handled in time order as the simulator's events are: the workload's stream (arrival times known
in advance), the later turns of its sessions (sent when the turn before finishes, sim/later_turns.py), and the
client's concurrency limit (sim/client_concurrency.py), which holds an arrival while its slots are taken and
sends one at each finish. Before a finish is handled, every arrival up to its time is offered to the limit, so a
request arriving during a step can take the slot that step's finish frees, as in the simulator.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.core import Request
from sim.client_concurrency import ConcurrencyLimit
from sim.later_turns import LaterTurns
from workloads import RequestSpec


class WallClockArrivals:
    def __init__(self, specs: Sequence[RequestSpec], max_concurrency: int | None = None) -> None:
        self.specs = sorted(specs, key=lambda spec: spec.arrival_time)
        self._next_index = 0
        self.later_turns = LaterTurns(self.specs) if any(spec.next_turns for spec in self.specs) else None
        self.client = None if max_concurrency is None else ConcurrencyLimit(max_concurrency)
        # Sent, in the order the engine is to receive them, not yet added.
        self._to_send: list[RequestSpec] = []

    def pending(self) -> bool:
        """Some request is still to be added: one the stream, a session or the client has not yet sent."""
        return bool(self._next_index < len(self.specs) or self._to_send
                    or (self.later_turns is not None and self.later_turns.outstanding)
                    or (self.client is not None and self.client.waiting))

    def next_arrival(self) -> float:
        """When the next request arrives (the stream's or a sent turn's), infinity when none is on its way."""
        upcoming = self.specs[self._next_index].arrival_time if self._next_index < len(self.specs) else float("inf")
        return min(upcoming, self.later_turns.next_arrival()) if self.later_turns is not None else upcoming

    def take(self, now: float) -> list[RequestSpec]:
        """The requests to add before a step that starts at ``now``, in order."""
        self._arrive_until(now)
        sent, self._to_send = self._to_send, []
        return sent

    def track(self, spec: RequestSpec, request: Request) -> None:
        if self.later_turns is not None:
            self.later_turns.track(spec, request)

    def on_finished(self, request_id: str, time: float) -> None:
        """The request finished at ``time``: the client may send a held request, its session the next turn."""
        if self.client is None and self.later_turns is None:
            return
        self._arrive_until(time)
        if self.client is not None:
            sent = self.client.on_finished(time)
            if sent is not None:
                self._to_send.append(sent)
        if self.later_turns is not None:
            self.later_turns.on_finished(request_id, time)

    def _arrive_until(self, now: float) -> None:
        """Offer every request arriving by ``now`` to the client, in arrival order (the stream's own order on ties)."""
        arrived = []
        specs = self.specs
        while self._next_index < len(specs) and specs[self._next_index].arrival_time <= now:
            arrived.append(specs[self._next_index])
            self._next_index += 1
        if self.later_turns is not None:
            arrived = sorted(arrived + self.later_turns.take_due(now), key=lambda spec: spec.arrival_time)
        if self.client is None:
            self._to_send += arrived
        else:
            self._to_send += [spec for spec in arrived if self.client.offer(spec) is not None]
