"""The waiting queue: arrival order for fcfs, or a heap on a ranked policy's rank (scheduling_policy.py).

FCFS: arrival order; a preempted request goes back to the head, so it resumes first.
Ranked (``priority`` and the others): the smallest rank first, ties broken by arrival time, then by request id
(for ``priority`` the order vLLM's ``Request.__lt__`` gives; ids are unique, so the order is total and
deterministic); a preempted request simply re-enters with its rank as of then.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Iterator

from engine.core.request import Request
from engine.core.scheduling_policy import Rank


class FCFSRequestQueue:
    __slots__ = ("_queue",)

    def __init__(self) -> None:
        self._queue: deque[Request] = deque()

    def add_request(self, request: Request) -> None:
        self._queue.append(request)

    def prepend_request(self, request: Request) -> None:
        self._queue.appendleft(request)

    def peek_request(self) -> Request:
        return self._queue[0]

    def pop_request(self) -> Request:
        return self._queue.popleft()

    def remove_request(self, request: Request) -> None:
        self._queue.remove(request)

    def __len__(self) -> int:
        return len(self._queue)

    def __bool__(self) -> bool:
        return bool(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)


class RankedRequestQueue:
    __slots__ = ("_heap", "_rank")

    def __init__(self, rank: Rank) -> None:
        self._rank = rank
        self._heap: list[tuple[object, float, str, Request]] = []

    def _key(self, request: Request) -> tuple[object, float, str, Request]:
        return (self._rank(request), request.arrival_time, request.request_id, request)

    def add_request(self, request: Request) -> None:
        heapq.heappush(self._heap, self._key(request))

    # A preempted request takes its place by rank: there is no "head" to return to.
    prepend_request = add_request

    def peek_request(self) -> Request:
        return self._heap[0][3]

    def pop_request(self) -> Request:
        return heapq.heappop(self._heap)[3]

    def remove_request(self, request: Request) -> None:
        self._heap = [entry for entry in self._heap if entry[3] is not request]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self) -> Iterator[Request]:
        """In scheduling order (a sorted copy: for inspection, not the hot path)."""
        return iter([entry[3] for entry in sorted(self._heap, key=lambda entry: entry[:3])])


def create_request_queue(rank: Rank | None) -> FCFSRequestQueue | RankedRequestQueue:
    """The queue of a policy whose rank function is ``rank`` (None: fcfs)."""
    return FCFSRequestQueue() if rank is None else RankedRequestQueue(rank)
