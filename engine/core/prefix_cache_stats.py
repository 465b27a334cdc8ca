"""Prefix-cache hit statistics.

A preempted request looks its blocks up again when it resumes; such hits only recover work the engine
already did, so they are counted apart from true hits (the hit rate users care about is for new work).

A request's lookup counts once, when it is admitted. vLLM counts every attempt to admit it, so a
request that waits at the head of the queue for several steps (no free blocks) is counted once per
step there; the two rates differ only while admission stalls, and this one is the share of prompt
tokens that the cache actually served.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class PrefixCacheStats:
    requests: int = 0
    queries: int = 0          # prompt tokens looked up by requests scheduled for the first time
    hits: int = 0             # of those, tokens served from the cache
    preempted_requests: int = 0
    preempted_queries: int = 0  # tokens looked up again by resumed (preempted) requests
    preempted_hits: int = 0
    resets: int = 0

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    def add(self, other: "PrefixCacheStats") -> None:
        for name in self.__slots__:
            setattr(self, name, getattr(self, name) + getattr(other, name))
