"""A cluster's traces: each replica's recorder, joined into one requests table and one steps table.

Both tables gain a ``replica`` column (the engine that served the request, or ran the step). Requests
keep the workload's arrival order; steps are grouped by replica, each replica's in its own order, and
``step`` counts each replica's steps from 0 as a single engine's do, so a replica's rows read like a
run of its own.

A disaggregated run (sim/disaggregation.py) has one row per request all the same, its decode replica's,
with the prefill replica and the KV load's times beside it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.trace_recorder import TraceRecorder

if TYPE_CHECKING:
    from sim.autoscaler import AutoscalingStats
    from sim.disaggregation import Disaggregation


class ClusterTrace:
    """``replica_of_request``: each request's replica, in arrival order. Disaggregated (``disaggregation``):
    the decode replica for a request handed to one, else the prefill replica where it ended. ``autoscaling``: an
    autoscaled cluster's billed replica-seconds and timeline (sim/autoscaler.py)."""

    def __init__(self, recorders: list[TraceRecorder], replica_of_request: dict[str, int],
                 disaggregation: Disaggregation | None = None, autoscaling: AutoscalingStats | None = None) -> None:
        self.recorders = recorders
        self.replica_of_request = replica_of_request
        self.disaggregation = disaggregation
        self.autoscaling = autoscaling
        # Data-parallel ranks in lockstep: what waiting for the slowest rank cost (sim/data_parallel_loop.py).
        self.lockstep = None

    def request_columns(self) -> dict[str, list]:
        per_replica = [recorder.request_columns() for recorder in self.recorders]
        # Where each request sits in each replica's columns (a disaggregated request is in two).
        position_in_replica = [{request_id: index for index, request_id in enumerate(columns["request_id"])}
                               for columns in per_replica]
        order = [(replica, position_in_replica[replica][request_id])
                 for request_id, replica in self.replica_of_request.items()]
        joined = {name: [per_replica[replica][name][index] for replica, index in order] for name in per_replica[0]}
        joined["replica"] = [replica for replica, _ in order]
        if self.disaggregation is not None:
            self._join_prefill_rows(joined, per_replica, position_in_replica)
        return joined

    def _join_prefill_rows(self, joined: dict[str, list], per_replica: list[dict], position_in_replica: list[dict]) -> None:
        """A handed-off request's row is its decode replica's (the user's tokens), but it was first scheduled,
        hit the prefix cache and may have been preempted on its prefill replica: those come from there."""
        prefill_replica_of = self.disaggregation.prefill_replica_of
        for row, (request_id, replica) in enumerate(self.replica_of_request.items()):
            prefill = prefill_replica_of.get(request_id)
            if prefill is None or prefill == replica:
                continue
            prefill_columns, position = per_replica[prefill], position_in_replica[prefill][request_id]
            joined["scheduled_time"][row] = prefill_columns["scheduled_time"][position]
            joined["num_cached_tokens"][row] = prefill_columns["num_cached_tokens"][position]
            joined["num_preemptions"][row] += prefill_columns["num_preemptions"][position]
        joined.update(self.disaggregation.request_columns(list(self.replica_of_request)))

    def step_columns(self) -> dict[str, list]:
        per_replica = [recorder.step_columns() for recorder in self.recorders]
        joined: dict[str, list] = {name: [] for name in per_replica[0]}
        joined["replica"] = []
        for replica, columns in enumerate(per_replica):
            for name, values in columns.items():
                joined[name].extend(values)
            joined["replica"].extend([replica] * len(columns["step"]))
        return joined

    def spec_decoding_counts(self) -> list[dict]:
        """Every replica's speculative decoding counts (analysis.spec_decode_stats merges them)."""
        return [counts for recorder in self.recorders for counts in recorder.spec_decoding_counts()]

    @property
    def steps(self) -> dict[str, list]:
        return self.step_columns()

    @property
    def num_finished(self) -> int:
        return sum(recorder.num_finished for recorder in self.recorders)
