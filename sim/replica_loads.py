"""The load counts a cluster's router reads: each replica's waiting and running requests.

Live (``cluster.stats_interval_s`` 0, the default): the replicas' own queues at the moment a request
arrives. Published (> 0): what vLLM's data-parallel front end sees. Its engines' counts reach it every
``stats_interval_s`` (vLLM: 100 ms, through the DP coordinator), and between two updates it adds each
request it routes to that replica's waiting count itself. The counts a router reads then lag the
replicas, as they do in vLLM, and a burst within one interval spreads by the router's own increments.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.core import EngineCore


class ReplicaLoads:
    def __init__(self, engines: Sequence[EngineCore], stats_interval_s: float = 0.0) -> None:
        self.engines = list(engines)
        self.stats_interval_s = stats_interval_s
        # Invariant (published mode): counts(i) == the counts replica i published last, plus the requests
        # routed to it since, as waiting.
        self._published = [(0, 0)] * len(self.engines)
        self._routed_since = [0] * len(self.engines)
        # The replicas a router now chooses among, by their index in ``engines`` (an autoscaled cluster routes
        # to its ready replicas only: sim/autoscaler.py); a router's index i is replica ``_replicas[i]``.
        # None: all of them, in order.
        self._replicas: list[int] | None = None

    def select(self, replicas: list[int] | None) -> None:
        """Route among ``replicas`` (indices into ``engines``) from now on; None: among all."""
        self._replicas = replicas

    @property
    def published(self) -> bool:
        return self.stats_interval_s > 0

    def counts(self, index: int) -> tuple[int, int]:
        """(waiting, running) of replica ``index`` (of those the router chooses among) as the router sees them."""
        if self._replicas is not None:
            index = self._replicas[index]
        if not self.published:
            scheduler = self.engines[index].scheduler
            return len(scheduler.waiting), len(scheduler.running)
        waiting, running = self._published[index]
        return waiting + self._routed_since[index], running

    def publish(self) -> None:
        """Every replica reports its counts (published mode: every ``stats_interval_s``)."""
        self._published = [(len(engine.scheduler.waiting), len(engine.scheduler.running)) for engine in self.engines]
        self._routed_since = [0] * len(self.engines)

    def routed(self, index: int) -> None:
        if self._replicas is not None:
            index = self._replicas[index]
        if self.published:
            self._routed_since[index] += 1

    def score(self, index: int) -> int:
        """vLLM's data-parallel load score: a waiting request weighs four running ones (it still needs its
        prefill, and it waits because the replica is full)."""
        waiting, running = self.counts(index)
        return 4 * waiting + running

    def outstanding(self, index: int) -> int:
        waiting, running = self.counts(index)
        return waiting + running
