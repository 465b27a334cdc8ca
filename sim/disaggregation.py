"""Disaggregated prefill and decode in the simulator: the hand-off between the two pools, and the KV link.

The deployment vLLM's disaggregated serving builds (a proxy in front of prefill engines and decode engines,
their KV moved by a connector such as NIXL):

1. The request arrives; the router picks a prefill replica, which runs the prompt with ``max_tokens`` 1
   (``do_remote_decode``). Its one sampled token is not the user's: the proxy discards it.
2. When it finishes, the router picks a decode replica among the decode replicas, which queues the
   request (``do_remote_prefill``). At its turn the decode scheduler allocates blocks for the prompt past
   its own prefix-cache hit, and the load starts (engine/core/kv_transfer.py).
3. The load takes ``latency + bytes / bandwidth`` and holds both replicas' links, each of which moves one
   load at a time, first come first served. Then the prefill replica frees its blocks (they stay in its prefix cache), and the
   decode replica schedules the request with every prompt token but the last computed: its first step
   computes that token and samples the user's first token.

The tokens the user sees, and so every latency in the requests table, are the decode replica's; the
table adds which prefill replica ran the prompt and when the KV moved.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import simpy

from engine.core import EngineCore, Request, SamplingParams
from engine.core.outputs import EngineCoreOutput
from sim.engine_requests import make_request
from sim.replica_loads import ReplicaLoads
from sim.router import Router, checked_choice
from workloads import RequestSpec

# The finish reason of a prefill whose KV is sent (engine/core/kv_transfer.py); any other (ignored, aborted)
# ends the request there.
_HANDED_OFF_REASONS = ("length",)


class KVTransferLink:
    """One replica's network link: a load takes ``latency_s + tokens * bytes_per_token / bandwidth`` and
    holds the link of both ends, the decode replica's (receiving) and the prefill replica's (sending):
    each moves one load at a time, first come first served, at the full bandwidth. (A real NIC shares
    its bandwidth between concurrent transfers; taking them in turn finishes the last at the same time.)"""

    def __init__(self, env: simpy.Environment, bytes_per_token: float, bandwidth_gbps: float,
                 latency_s: float) -> None:
        self.channel = simpy.Resource(env, capacity=1)
        self.bytes_per_token = bytes_per_token
        self.seconds_per_byte = 1.0 / (bandwidth_gbps * 1e9)
        self.latency_s = latency_s

    def duration(self, num_tokens: int) -> float:
        return self.latency_s + num_tokens * self.bytes_per_token * self.seconds_per_byte


@dataclass(frozen=True)
class DisaggregationSetup:
    """What a disaggregated cluster is: how many replicas prefill, each pool's router and the loads it
    reads (over that pool's engines only), and the KV link (bytes of KV per token a decode replica's GPU
    receives, and the link's GB/s and fixed cost per load)."""

    num_prefill: int
    prefill_router: Router
    prefill_loads: ReplicaLoads
    decode_router: Router
    decode_loads: ReplicaLoads
    bytes_per_token: float
    bandwidth_gbps: float
    latency_s: float


class Disaggregation:
    """Replicas ``0 .. num_prefill - 1`` prefill, the rest decode. ``wake(index)`` wakes a replica's loop
    and ``on_decode_arrival(index, spec)`` records a request reaching a decode replica (the simulation's);
    every index here is the replica's index in the whole cluster."""

    def __init__(self, env: simpy.Environment, engines: Sequence[EngineCore], setup: DisaggregationSetup,
                 requests: Sequence[RequestSpec], wake: Callable[[int], None],
                 on_decode_arrival: Callable[[int, RequestSpec], None]) -> None:
        self.env = env
        self.engines = list(engines)
        self.num_prefill = num_prefill = setup.num_prefill
        self.prefill_engines = self.engines[:num_prefill]
        self.decode_engines = self.engines[num_prefill:]
        self.prefill_router, self.prefill_loads = setup.prefill_router, setup.prefill_loads
        self.decode_router, self.decode_loads = setup.decode_router, setup.decode_loads
        # Every replica's link, by its index in the cluster: a load holds its decode replica's, then its
        # prefill replica's (always in that order, so two loads never wait on each other's).
        self.links = [KVTransferLink(env, setup.bytes_per_token, setup.bandwidth_gbps, setup.latency_s)
                      for _ in self.engines]
        self.spec_of = {spec.request_id: spec for spec in requests}
        self._params_by_output_len: dict[int, SamplingParams] = {}
        self.num_requests = len(self.spec_of)
        self._wake = wake
        self._on_decode_arrival = on_decode_arrival
        # Per request: where each half ran, and when its KV was ready, started and finished moving.
        self.prefill_replica_of: dict[str, int] = {}
        self.decode_replica_of: dict[str, int] = {}
        self.prefill_end_time: dict[str, float] = {}
        self.kv_load_start_time: dict[str, float] = {}
        self.kv_load_end_time: dict[str, float] = {}
        self.kv_load_tokens: dict[str, int] = {}
        # Requests handed to a decode replica or ended at their prefill: the decode replicas' loops end
        # once every request is settled and their own work is done.
        self.num_settled = 0

    @property
    def all_settled(self) -> bool:
        return self.num_settled >= self.num_requests

    def is_prefill(self, index: int) -> bool:
        return index < self.num_prefill

    def make_prefill_request(self, spec: RequestSpec) -> Request:
        return make_request(spec, self._params_by_output_len, max_tokens=1, do_remote_decode=True)

    def route_arrival(self, request: Request) -> int:
        index = checked_choice(self.prefill_router, request, self.prefill_engines, self.prefill_loads)
        self.prefill_replica_of[request.request_id] = index
        return index

    def on_prefill_outputs(self, outputs: list[EngineCoreOutput], now: float) -> None:
        """At the end of a prefill replica's step: hand each finished prefill to a decode replica."""
        for output in outputs:
            if output.finish_reason is None:
                continue
            self.num_settled += 1
            if output.finish_reason in _HANDED_OFF_REASONS:
                self._hand_off(self.spec_of[output.request_id], now)
        if self.all_settled:
            for index in range(self.num_prefill, len(self.engines)):
                self._wake(index)

    def _hand_off(self, spec: RequestSpec, now: float) -> None:
        request = make_request(spec, self._params_by_output_len, do_remote_prefill=True)
        decode = checked_choice(self.decode_router, request, self.decode_engines, self.decode_loads)
        index = self.num_prefill + decode
        self.decode_replica_of[spec.request_id] = index
        self.prefill_end_time[spec.request_id] = now
        self._on_decode_arrival(index, spec)
        self.engines[index].add_request(request)
        self._wake(index)

    def start_loads(self, index: int, kv_loads: dict[str, int]) -> None:
        """A decode replica's step allocated blocks for these requests: their loads start on its link."""
        for request_id, num_tokens in kv_loads.items():
            self.env.process(self._load(index, request_id, num_tokens))

    def _load(self, index: int, request_id: str, num_tokens: int):
        prefill = self.prefill_replica_of[request_id]
        receiving, sending = self.links[index], self.links[prefill]
        with receiving.channel.request() as receiver_turn:
            yield receiver_turn
            with sending.channel.request() as sender_turn:
                yield sender_turn
                self.kv_load_start_time[request_id] = self.env.now
                self.kv_load_tokens[request_id] = num_tokens
                yield self.env.timeout(receiving.duration(num_tokens))
        self.kv_load_end_time[request_id] = self.env.now
        self.engines[prefill].scheduler.finish_kv_send(request_id)
        self.engines[index].scheduler.finish_kv_load(request_id)
        self._wake(prefill)
        self._wake(index)

    def request_columns(self, request_ids: Sequence[str]) -> dict[str, list]:
        """The columns a disaggregated run's requests table adds, in the order of ``request_ids``."""
        def times(source: dict[str, float]) -> list[float]:
            return [source.get(request_id, math.nan) for request_id in request_ids]

        return {
            "prefill_replica": [self.prefill_replica_of.get(request_id, -1) for request_id in request_ids],
            "prefill_end_time": times(self.prefill_end_time),
            "kv_load_start_time": times(self.kv_load_start_time),
            "kv_load_end_time": times(self.kv_load_end_time),
            "kv_load_tokens": [self.kv_load_tokens.get(request_id, 0) for request_id in request_ids],
        }
