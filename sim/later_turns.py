"""The later turns of a run's multi-turn sessions (workload.sessions): which finished request sends which turn, when.

A later turn is not in the request stream before the run: it is sent ``think_time_s`` after the turn before
it finishes, and its prompt is that turn's whole sequence (prompt and generated tokens, read from the engine's
request) followed by its own user tokens. The simulator and the wall-clock driver (of a real run and of its
re-timing) ask this object at each finished request, so both make the same requests at the same logical times,
and a replay of a real run reproduces them; a server run (sim/server_run.py) builds each turn with the same
``RequestSpec.next_turn`` from the token ids the server returned.

Invariants: a turn is sent once, after the request before it finished; ``outstanding`` counts the turns not
yet arrived, so a driver knows when no request will come any more.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from engine.core import Request
from workloads import RequestSpec


class LaterTurns:
    def __init__(self, specs: Iterable[RequestSpec]) -> None:
        # Turns not yet arrived: the first turns' later ones, all counted up front.
        self.outstanding = sum(len(spec.next_turns) for spec in specs)
        # The requests in the engine whose session has a next turn, with their specs, by request id.
        self._senders: dict[str, tuple[RequestSpec, Request]] = {}
        # The turns sent but not yet arrived, a heap on (arrival time, order sent): where a fast-forward must
        # stop, and what a wall-clock driver adds when its clock reaches them.
        self._pending: list[tuple[float, int, RequestSpec]] = []
        self._num_sent = 0

    def track(self, spec: RequestSpec, request: Request) -> None:
        """``request`` (made from ``spec``) entered the engine; when it finishes, its session's next turn is sent."""
        if spec.next_turns:
            self._senders[spec.request_id] = (spec, request)

    def next_think_time(self, request_id: str) -> float | None:
        """Seconds from the request's finish to its session's next turn, or None when it sends none."""
        entry = self._senders.get(request_id)
        return None if entry is None else entry[0].next_turns[0].think_time_s

    def on_finished(self, request_id: str, finish_time: float) -> RequestSpec | None:
        """The next turn of the session of the request that finished at ``finish_time``, if there is one."""
        entry = self._senders.pop(request_id, None)
        if entry is None:
            return None
        spec, request = entry
        turn = spec.next_turn(request.all_token_ids, finish_time)
        heapq.heappush(self._pending, (turn.arrival_time, self._num_sent, turn))
        self._num_sent += 1
        return turn

    def on_arrived(self) -> None:
        """The earliest sent turn reached the engine (a simulation delivers each turn at its arrival time)."""
        heapq.heappop(self._pending)
        self.outstanding -= 1

    def take_due(self, now: float) -> list[RequestSpec]:
        """The sent turns whose arrival time is ``now`` or earlier, in order, as arrived (a wall-clock driver's)."""
        due = []
        while self._pending and self._pending[0][0] <= now:
            due.append(heapq.heappop(self._pending)[2])
        self.outstanding -= len(due)
        return due

    def next_arrival(self) -> float:
        """When the earliest turn already sent arrives (infinity when none is on its way)."""
        return self._pending[0][0] if self._pending else float("inf")
