"""KV offloading in the simulator: the host tier's size, and its loads over each GPU's host link.

``engine.kv_offloading_size_gib`` is vLLM's ``--kv-offloading-size``: host memory for the KV of the whole
engine (every layer, every tensor-parallel GPU's shard). The core keeps which blocks the host holds
(engine/core/kv_offload.py); this file times the loads it starts. A load moves each GPU's shard of the
loaded tokens' KV over that GPU's own PCIe link to the host, all GPUs at once, so it takes
``latency + tokens * bytes per token per GPU / bandwidth``. A replica's link moves one load at a time,
first come first served, beside the model's steps (vLLM copies on its own CUDA stream): a load does not
slow a step, and a step does not slow a load. The copies to the host (each computed block, once) overlap
the steps in the other direction of the link and are not timed.

Not measured here: no GPU machine timed a host load. The link's effective bandwidth is taken as 80% of the
PCIe datasheet figure (pinned-memory copies reach about that), with 20 us per load for its launch and
completion polling.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import simpy

from engine.core import Scheduler
from sim.disaggregation import KVTransferLink

HOST_LINK_EFFICIENCY = 0.8
HOST_LOAD_LATENCY_S = 20e-6


@dataclass(frozen=True)
class HostLinkSetup:
    """What a load costs: the bytes of one token's KV on one GPU, the link's effective GB/s, the fixed cost."""

    bytes_per_token: float
    bandwidth_gbps: float
    latency_s: float = HOST_LOAD_LATENCY_S

    def link(self, env: simpy.Environment) -> KVTransferLink:
        """The link a replica loads over: one load at a time, ``latency + bytes / bandwidth`` each, as a
        disaggregated replica's network link (sim/disaggregation.py)."""
        return KVTransferLink(env, self.bytes_per_token, self.bandwidth_gbps, self.latency_s)


def offload_capacity_blocks(size_gib: float, bytes_per_block: int) -> int:
    """Blocks of the whole engine's KV (every layer and GPU) that ``size_gib`` of host memory holds."""
    return int(size_gib * 2**30 // bytes_per_block)


class HostLoads:
    """One replica's loads from its host tier, and what each request loaded (for the requests table)."""

    def __init__(self, env: simpy.Environment, setup: HostLinkSetup, scheduler: Scheduler,
                 wake: Callable[[], None]) -> None:
        self.env = env
        self.link = setup.link(env)
        self.scheduler = scheduler
        self.wake = wake
        # Per request: tokens loaded from the host, and seconds from each load's start (queueing included) to
        # its end, summed over its loads (a request preempted and resumed may load again).
        self.loaded_tokens: dict[str, int] = {}
        self.load_seconds: dict[str, float] = {}

    def start_loads(self, kv_loads: dict[str, int]) -> None:
        for request_id, num_tokens in kv_loads.items():
            self.env.process(self._load(request_id, num_tokens))

    def _load(self, request_id: str, num_tokens: int):
        started = self.env.now
        with self.link.channel.request() as turn:
            yield turn
            yield self.env.timeout(self.link.duration(num_tokens))
        self.loaded_tokens[request_id] = self.loaded_tokens.get(request_id, 0) + num_tokens
        self.load_seconds[request_id] = self.load_seconds.get(request_id, 0.0) + self.env.now - started
        # False when the request was aborted meanwhile: its blocks went with it.
        self.scheduler.finish_kv_load(request_id)
        self.wake()

    def request_columns(self, request_ids: list[str]) -> dict[str, list]:
        return {"offload_loaded_tokens": [self.loaded_tokens.get(request_id, 0) for request_id in request_ids],
                "offload_load_s": [self.load_seconds.get(request_id, 0.0) for request_id in request_ids]}
