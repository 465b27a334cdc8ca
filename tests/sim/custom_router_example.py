"""Routers of a user's own, loaded by ``cluster.router: "tests.sim.custom_router_example:<Class>"``."""

from __future__ import annotations


class FewestWaiting:
    """Join the shortest queue: the replica with the fewest waiting requests (ties: the lowest index)."""

    def choose(self, request, replicas) -> int:
        waiting = [len(engine.scheduler.waiting) for engine in replicas]
        return waiting.index(min(waiting))


class EveryOtherToTheLast:
    """Built with the workload (its constructor takes one): odd arrivals to the last replica, even to 0."""

    def __init__(self, workload) -> None:
        self.last = workload.cluster.num_replicas - 1
        self.count = 0

    def choose(self, request, replicas) -> int:
        self.count += 1
        return self.last if self.count % 2 == 0 else 0


class OutOfRange:
    def choose(self, request, replicas) -> int:
        return len(replicas)


class NoChoose:
    pass


class KeywordWorkload:
    """Takes the workload by name, with a default: everything to the last replica."""

    def __init__(self, *, workload=None) -> None:
        self.last = workload.cluster.num_replicas - 1

    def choose(self, request, replicas) -> int:
        return self.last


class NumpyArgmin:
    """Answers with numpy's integer type, as a router written with numpy would."""

    def choose(self, request, replicas):
        import numpy as np

        return np.argmin([len(engine.scheduler.waiting) + len(engine.scheduler.running) for engine in replicas])


class NeedsTwo:
    def __init__(self, workload, threshold) -> None:
        self.threshold = threshold

    def choose(self, request, replicas) -> int:
        return 0


class ChoosesAFloat:
    def choose(self, request, replicas):
        return 0.0
