"""Scheduling policies: the order of the waiting queue, and which running request a short pool preempts.

- ``fcfs`` (vLLM's default): arrival order; a preempted request goes back to the head. The victim is the
  last running request (the newest admitted).
- ``priority`` (vLLM's): a lower ``Request.priority`` first. The rank of a request is ``(priority,
  arrival_time)``; the victim is the running request of largest rank, and a request may preempt running
  ones of larger rank to make room.

The others are ours, for studying policies on the same engine. Every ranked policy works as ``priority``
does, with its own rank in place of ``priority`` (ties broken by arrival time, then request id):

- ``shortest_prompt_first``: fewer prompt tokens first.
- ``shortest_output_first``: fewer output tokens left to the request's ``max_tokens`` first (the
  shortest-job-first of the literature: an oracle when ``max_tokens`` is the output length, as in a
  simulated workload with ``ignore_eos``; a request without ``max_tokens`` goes last).
- ``"module:function"``: ``function(request)`` returns the rank, anything that sorts (a number, a tuple);
  lower is served first. It is called when a request enters the queue (on arrival and when preempted) and
  on the running requests when the pool runs short. It must be deterministic for a simulation to be: the
  core is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.core.request import Request
from engine.core.named_import import import_named_callable

Rank = Callable[[Request], Any]

_NO_LIMIT = float("inf")


def _priority(request: Request) -> int:
    return request.priority


def _prompt_tokens(request: Request) -> int:
    return request.num_prompt_tokens


def _output_tokens_left(request: Request) -> float:
    if request.max_tokens is None:
        return _NO_LIMIT
    return request.max_tokens - (request.num_tokens - request.num_prompt_tokens)


NAMED_RANKS: dict[str, Rank] = {
    "priority": _priority,
    "shortest_prompt_first": _prompt_tokens,
    "shortest_output_first": _output_tokens_left,
}
NAMED_POLICIES = ("fcfs", *NAMED_RANKS)


def policy_rank(policy: str) -> Rank | None:
    """The rank function of ``policy`` (None for fcfs, which keeps arrival order). Raises ValueError with what
    is wrong for an unknown name, or a ``module:function`` that does not import or is not callable."""
    if policy == "fcfs":
        return None
    if policy in NAMED_RANKS:
        return NAMED_RANKS[policy]
    return import_named_callable(policy, "function", f"one of {', '.join(map(repr, NAMED_POLICIES))}, or "
                                 "'module:function' naming a rank function")


def victim_rank(rank: Rank) -> Callable[[Request], tuple]:
    """The key a short pool preempts by under a ranked policy: the running request of largest
    ``(rank, arrival_time)``, the lowest-ranked and then the latest to arrive. Requests that tie on both (a
    burst arriving at one instant) are not ranked further: ``max`` keeps the first of them in running order,
    as vLLM's does, so the earliest admitted of them is the victim."""
    return lambda request: (rank(request), request.arrival_time)


def reads_priority(policy: str) -> bool:
    """Whether a request's ``priority`` can change its place under ``policy``: under the others a priority
    other than 0 would be ignored, and the front ends refuse it (as vLLM does under fcfs)."""
    return policy not in ("fcfs", "shortest_prompt_first", "shortest_output_first")
