"""A cluster's traces: each replica's recorder, joined into one requests table and one steps table.

Both tables gain a ``replica`` column (the engine that served the request, or ran the step). Requests
keep the workload's arrival order; steps are grouped by replica, each replica's in its own order, and
``step`` counts each replica's steps from 0 as a single engine's do, so a replica's rows read like a
run of its own.
"""

from __future__ import annotations

from sim.trace_recorder import TraceRecorder


class ClusterTrace:
    def __init__(self, recorders: list[TraceRecorder], replica_of_request: dict[str, int]) -> None:
        self.recorders = recorders
        self.replica_of_request = replica_of_request

    def request_columns(self) -> dict[str, list]:
        per_replica = [recorder.request_columns() for recorder in self.recorders]
        # Where each request sits in its replica's columns, visited in arrival order.
        position_in_replica: dict[str, int] = {}
        for columns in per_replica:
            position_in_replica.update((request_id, index) for index, request_id in enumerate(columns["request_id"]))
        order = [(replica, position_in_replica[request_id]) for request_id, replica in self.replica_of_request.items()]
        joined = {name: [per_replica[replica][name][index] for replica, index in order] for name in per_replica[0]}
        joined["replica"] = [replica for replica, _ in order]
        return joined

    def step_columns(self) -> dict[str, list]:
        per_replica = [recorder.step_columns() for recorder in self.recorders]
        joined: dict[str, list] = {name: [] for name in per_replica[0]}
        joined["replica"] = []
        for replica, columns in enumerate(per_replica):
            for name, values in columns.items():
                joined[name].extend(values)
            joined["replica"].extend([replica] * len(columns["step"]))
        return joined

    @property
    def steps(self) -> dict[str, list]:
        return self.step_columns()

    @property
    def num_finished(self) -> int:
        return sum(recorder.num_finished for recorder in self.recorders)
