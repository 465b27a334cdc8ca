"""The waiting queue: arrival order for fcfs, or a heap on a ranked policy's rank (scheduling_policy.py).

FCFS: arrival order; a preempted request goes back to the head, so it resumes first.
Ranked (``priority`` and the others): the smallest rank first, ties broken by arrival time, then by request id
(for ``priority`` the order vLLM's ``Request.__lt__`` gives; ids are unique, so the order is total and
deterministic); a preempted request simply re-enters with its rank as of then.

With LoRA on (``count_adapters``), each queue also counts its requests by adapter id (None: the base model),
so that admission can tell in one look that every waiting request needs an adapter slot the running requests
do not leave free (engine/core/waiting_admission.py): then none can be admitted, and the queue is not scanned.
Invariant: ``_adapter_counts[id]`` is the number of queued requests whose adapter id is ``id`` (absent: 0).
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Iterator

from engine.core.request import Request
from engine.core.scheduling_policy import Rank


class _AdapterCounts:
    """Requests per adapter id, kept by the queues when LoRA is on (None otherwise: no work per request)."""
    __slots__ = ("_adapter_counts",)

    def __init__(self, count_adapters: bool) -> None:
        self._adapter_counts: dict[int | None, int] | None = {} if count_adapters else None

    def _counted(self, request: Request, delta: int) -> None:
        counts = self._adapter_counts
        if counts is not None:
            lora = request.lora_request
            key = None if lora is None else lora.lora_int_id
            remaining = counts.get(key, 0) + delta
            if remaining:
                counts[key] = remaining
            else:
                del counts[key]

    def holds_base_or_adapter_of(self, adapter_ids: set[int]) -> bool:
        """Whether some queued request uses the base model or one of ``adapter_ids`` (True when not counting)."""
        counts = self._adapter_counts
        return counts is None or None in counts or any(adapter_id in counts for adapter_id in adapter_ids)


class FCFSRequestQueue(_AdapterCounts):
    __slots__ = ("_queue",)

    def __init__(self, count_adapters: bool = False) -> None:
        super().__init__(count_adapters)
        self._queue: deque[Request] = deque()

    def add_request(self, request: Request) -> None:
        self._queue.append(request)
        self._counted(request, 1)

    def prepend_request(self, request: Request) -> None:
        self._queue.appendleft(request)
        self._counted(request, 1)

    def peek_request(self) -> Request:
        return self._queue[0]

    def pop_request(self) -> Request:
        request = self._queue.popleft()
        self._counted(request, -1)
        return request

    def remove_request(self, request: Request) -> None:
        self._queue.remove(request)
        self._counted(request, -1)

    def __len__(self) -> int:
        return len(self._queue)

    def __bool__(self) -> bool:
        return bool(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)


class RankedRequestQueue(_AdapterCounts):
    __slots__ = ("_heap", "_rank")

    def __init__(self, rank: Rank, count_adapters: bool = False) -> None:
        super().__init__(count_adapters)
        self._rank = rank
        self._heap: list[tuple[object, float, str, Request]] = []

    def _key(self, request: Request) -> tuple[object, float, str, Request]:
        return (self._rank(request), request.arrival_time, request.request_id, request)

    def add_request(self, request: Request) -> None:
        heapq.heappush(self._heap, self._key(request))
        self._counted(request, 1)

    # A preempted request takes its place by rank: there is no "head" to return to.
    prepend_request = add_request

    def peek_request(self) -> Request:
        return self._heap[0][3]

    def pop_request(self) -> Request:
        request = heapq.heappop(self._heap)[3]
        self._counted(request, -1)
        return request

    def remove_request(self, request: Request) -> None:
        before = len(self._heap)
        self._heap = [entry for entry in self._heap if entry[3] is not request]
        heapq.heapify(self._heap)
        if len(self._heap) < before:
            self._counted(request, -1)

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self) -> Iterator[Request]:
        """In scheduling order (a sorted copy: for inspection, not the hot path)."""
        return iter([entry[3] for entry in sorted(self._heap, key=lambda entry: entry[:3])])


def create_request_queue(rank: Rank | None, count_adapters: bool = False) -> FCFSRequestQueue | RankedRequestQueue:
    """The queue of a policy whose rank function is ``rank`` (None: fcfs); ``count_adapters`` with LoRA on."""
    return FCFSRequestQueue(count_adapters) if rank is None else RankedRequestQueue(rank, count_adapters)
