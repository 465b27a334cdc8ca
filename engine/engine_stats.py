"""Serving statistics gathered by the engine thread after every step, read by any other thread.

What a ``/metrics`` endpoint needs: the scheduler's state (running and waiting requests, KV-cache use,
free and usable blocks), counters (prefix-cache queries and hits in tokens, preemptions, prompt and
generated tokens, finished requests by finish reason) and latency histograms (time to first token,
inter-token latency, end-to-end latency). The engine thread is the only writer; readers take a
consistent copy with ``snapshot()`` (one lock, held for a few microseconds per step).

Latencies are measured where tokens leave the engine (the output processor's timestamps), so they
exclude the HTTP layer; a client measures its own.
"""

from __future__ import annotations

import copy
import threading
import time
from dataclasses import dataclass, field

from engine.core import Scheduler
from engine.core.request import FINISH_REASONS
from engine.outputs import RequestOutput

# Bucket upper bounds in seconds (vLLM's, with finer low buckets: a CPU tiny model answers in ms).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
               5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0)


@dataclass
class Histogram:
    """A cumulative-bucket histogram, as Prometheus exposes one (the +Inf bucket is ``count``)."""
    buckets: tuple[float, ...]
    bucket_counts: list[int] = field(default_factory=list)  # observations <= buckets[i]
    count: int = 0
    total: float = 0.0

    def __post_init__(self) -> None:
        if not self.bucket_counts:
            self.bucket_counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        self.count += 1
        self.total += value
        for index, bound in enumerate(self.buckets):
            if value <= bound:
                self.bucket_counts[index] += 1


@dataclass
class EngineStatsSnapshot:
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0
    kv_cache_free_blocks: int = 0
    kv_cache_usable_blocks: int = 0
    prefix_cache_queries: int = 0   # prompt tokens looked up (first scheduling only)
    prefix_cache_hits: int = 0      # of those, tokens found in the cache
    num_preemptions: int = 0
    prompt_tokens: int = 0          # of finished requests
    generation_tokens: int = 0
    num_steps: int = 0
    # Speculative decoding (engine/core/spec_decode.py): verified drafts, their tokens, the accepted ones.
    spec_decode_num_drafts: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    # LoRA (vLLM's lora_requests_info): max_loras (0: off), the adapters of running and waiting requests, and
    # when they were read (wall time, the gauge's value in vLLM).
    max_lora: int = 0
    running_lora_adapters: list[str] = field(default_factory=list)
    waiting_lora_adapters: list[str] = field(default_factory=list)
    lora_info_time: float = 0.0
    finished_requests: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISH_REASONS.values(), 0))
    time_to_first_token: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    inter_token_latency: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    e2e_request_latency: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))


class EngineStats:
    def __init__(self, scheduler: Scheduler) -> None:
        self._lock = threading.Lock()
        self._stats = EngineStatsSnapshot()
        # Engine-thread-only: the last token time seen per unfinished request, to measure the gaps.
        self._last_token_time: dict[str, float] = {}
        self.record_scheduler(scheduler)

    def snapshot(self) -> EngineStatsSnapshot:
        with self._lock:
            return copy.deepcopy(self._stats)

    def record_scheduler(self, scheduler: Scheduler) -> None:
        """After a step: the scheduler's state and the prefix-cache counters it gathered since the last one."""
        manager = scheduler.kv_cache_manager
        prefix = manager.make_prefix_cache_stats()
        with self._lock:
            stats = self._stats
            stats.num_running_reqs = len(scheduler.running)
            stats.num_waiting_reqs = len(scheduler.waiting)
            stats.kv_cache_usage = manager.usage
            stats.kv_cache_free_blocks = manager.num_free_blocks
            stats.kv_cache_usable_blocks = manager.num_usable_blocks
            stats.prefix_cache_queries += prefix.queries
            stats.prefix_cache_hits += prefix.hits
            stats.num_preemptions = scheduler.num_preemptions_total
            if scheduler.max_loras:  # a walk over the queues only where adapters can be in them
                stats.max_lora = scheduler.max_loras
                stats.running_lora_adapters = _adapter_names(scheduler.running)
                stats.waiting_lora_adapters = _adapter_names(scheduler.waiting)
                stats.lora_info_time = time.time()
            spec = scheduler.spec_decoding_stats
            if spec is not None:
                stats.spec_decode_num_drafts = spec.num_drafts
                stats.spec_decode_num_draft_tokens = spec.num_draft_tokens
                stats.spec_decode_num_accepted_tokens = spec.num_accepted_tokens

    def record_step(self, scheduler: Scheduler, num_new_tokens: int, request_outputs: list[RequestOutput]) -> None:
        last_token_time = self._last_token_time
        with self._lock:
            stats = self._stats
            stats.num_steps += 1
            stats.generation_tokens += num_new_tokens
            for output in request_outputs:
                metrics = output.metrics
                request_id = output.request_id
                if metrics is not None and metrics.last_token_time is not None:
                    previous = last_token_time.get(request_id)
                    if previous is None:
                        stats.time_to_first_token.observe(metrics.first_token_time - metrics.arrival_time)
                    elif metrics.last_token_time > previous:
                        stats.inter_token_latency.observe(metrics.last_token_time - previous)
                    last_token_time[request_id] = metrics.last_token_time
                if output.finished:
                    last_token_time.pop(request_id, None)
                    reason = output.outputs[0].finish_reason or "abort"
                    stats.finished_requests[reason] = stats.finished_requests.get(reason, 0) + 1
                    stats.prompt_tokens += len(output.prompt_token_ids)
                    if metrics is not None and metrics.finished_time is not None:
                        stats.e2e_request_latency.observe(metrics.finished_time - metrics.arrival_time)
        self.record_scheduler(scheduler)

    def record_failed(self, request_ids) -> None:
        """Requests a failed engine step ended without a final output: counted as finished with reason
        "error" (a dashboard of /metrics must show them, not only the client that got the 500), and
        their per-request state dropped."""
        with self._lock:
            for request_id in request_ids:
                self._last_token_time.pop(request_id, None)
                self._stats.finished_requests["error"] = self._stats.finished_requests.get("error", 0) + 1


def _adapter_names(requests) -> list[str]:
    return sorted({request.lora_request.lora_name for request in requests if request.lora_request is not None})
