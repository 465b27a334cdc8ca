"""The discrete-event simulation: arrivals and the engine loop as SimPy processes, in virtual time.

The engine loop is the real ``EngineCore`` with the real ``Scheduler`` and ``KVCacheManager``; only
the executor differs (a cost model instead of a model). A step is scheduled at its start time, lasts
what the cost model predicts, and its tokens are stamped with its end time. Requests that arrive
while a step runs wait in the queue and are considered by the next ``schedule()``, exactly as in a
real server.

A cluster (``cluster.num_replicas`` > 1) is several such engines, each with its own loop, in one
virtual clock; a router (sim/router.py) gives each arriving request to one of them. The core runs a
step's scheduling and bookkeeping when the step starts, so at any instant an engine's state is the
state its current step leaves: that is what the router reads, as a real router reads the counts an
engine last reported.

A disaggregated cluster (``cluster.prefill_replicas`` > 0) routes arrivals to its prefill replicas and
hands each finished prefill to a decode replica, which loads the prompt's KV over the two replicas' links
(sim/disaggregation.py). Its decode replicas take every step in order: the fast-forward is off, since a
hand-off may reach a decode replica at the end of any prefill step.

An engine with pipeline parallelism (``engine.pipeline_parallel_size`` > 1) or async scheduling keeps several
batches in flight; its loop is sim/pipeline_stages.py's, without the fast-forward.

An engine that serves LoRA adapters pays each step's adapter loads before the step (sim/lora_steps.py); a
fast-forward carries each step's adapter counts and its first step's loads.

An engine with KV offloading (a host tier of its prefix cache) loads from host memory over its replica's host
link (sim/kv_offload_loads.py): a loading request waits in the queue, so no fast-forward runs meanwhile.

A workload with multi-turn sessions sends each later turn when the turn before it finishes (sim/later_turns.py):
a fast-forward then stops at the step that finishes a request with a next turn, and at the next turn on its way.
A client with a concurrency limit (``workload.max_concurrency``, sim/client_concurrency.py) holds arrivals while
its slots are taken and sends one at each finish: a fast-forward then stops at the first finish. In a cluster,
where such a request may go to a replica in the middle of a stretch it planned, the fast-forward is off.

An autoscaled cluster (``cluster.autoscaling``, sim/autoscaler.py) routes to its ready replicas only; the
autoscaler's decisions read every replica's state, so a fast-forward stops at each.
The ranks of a data-parallel mixture of experts (``engine.data_parallel_size`` > 1) are replicas that step in
lockstep, a loop for each data-parallel engine (sim/data_parallel_loop.py), without the fast-forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import simpy
from tqdm import tqdm

from engine.core import EngineCore, SamplingParams
from engine.core.decode_fast_forward import DecodeFastForward
from sim.autoscaler import Autoscaler, AutoscalingStats
from sim.client_concurrency import ConcurrencyLimit
from sim.cluster_trace import ClusterTrace
from sim.cost_models.expert_parallel import ExpertParallelMoE
from sim.data_parallel_loop import LockstepStats, data_parallel_loop
from sim.disaggregation import Disaggregation, DisaggregationSetup
from sim.engine_requests import make_request
from sim.fast_forward_steps import fast_forward, plan_durations
from sim.later_turns import LaterTurns
from sim.livelock import check_preemptions
from sim.pipeline_stages import pipelined_engine_loop
from sim.kv_offload_loads import HostLinkSetup, HostLoads
from sim.replica_loads import ReplicaLoads
from sim.router import Router, checked_choice
from sim.sim_executor import SimulatedExecutor
from sim.trace_recorder import TraceRecorder
from workloads import RequestSpec
from workloads.autoscaling_section import AutoscalingSection
from workloads.request_spec import count_requests


class SchedulerStalledError(RuntimeError):
    """Requests are pending but the scheduler scheduled nothing: a bug, never a workload property."""


@dataclass
class Replica:
    """One engine of the run, with what its loop needs: the executor it owns and the traces it writes."""

    engine: EngineCore
    recorder: TraceRecorder
    executor: SimulatedExecutor = field(init=False)
    # Set while the loop sleeps for lack of work; an arrival routed here wakes it.
    idle: simpy.Event | None = None
    # Loads from the host tier of its prefix cache (KV offloading), when it has one.
    host_loads: HostLoads | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.engine.executor, SimulatedExecutor):
            raise TypeError("Simulation needs an EngineCore whose executor is a SimulatedExecutor")
        self.executor = self.engine.executor

    def wake(self) -> None:
        if self.idle is not None and not self.idle.triggered:
            self.idle.succeed()

    def sleep(self, env: simpy.Environment):
        """Wait until ``wake``: an arrival routed here, a KV load done, or the end of the arrivals."""
        self.idle = env.event()
        yield self.idle
        self.idle = None


class Simulation:
    def __init__(self, engine: EngineCore | Sequence[EngineCore], requests: Sequence[RequestSpec], *,
                 router: Router | None = None, loads: ReplicaLoads | None = None, progress: bool = False,
                 description: str = "simulating", fast_forward: bool = True, record_schedule: bool = False,
                 disaggregation: DisaggregationSetup | None = None, host_link: HostLinkSetup | None = None,
                 max_concurrency: int | None = None, autoscaling: AutoscalingSection | None = None,
                 expert_parallel: ExpertParallelMoE | None = None) -> None:
        engines = [engine] if isinstance(engine, EngineCore) else list(engine)
        if not engines:
            raise ValueError("Simulation needs at least one engine")
        if len(engines) > 1 and router is None and disaggregation is None:
            raise ValueError(f"a cluster of {len(engines)} engines needs a router")
        self.replicas = [Replica(each, TraceRecorder(record_schedule=record_schedule)) for each in engines]
        self._engines = engines  # what the router chooses among, in replica order
        with_sessions = any(spec.session_id is not None for spec in requests)
        with_images = any(spec.images for spec in requests)
        for replica in self.replicas:
            replica.recorder.track_spec_decoding(replica.engine.scheduler.spec_decoding_stats)
            replica.recorder.track_lora(replica.executor.lora)
            if with_sessions:
                replica.recorder.track_sessions()
            if with_images:
                replica.recorder.track_images()
            if max_concurrency is not None:
                replica.recorder.track_client_waits()
        self.router = router
        # The counts the router weighs (live by default); the router's built-in policies read the same object.
        self.loads = loads if loads is not None else ReplicaLoads(engines)
        self.requests = sorted(requests, key=lambda spec: spec.arrival_time)
        self.env = simpy.Environment()
        self.disaggregation = None if disaggregation is None else Disaggregation(
            self.env, engines, disaggregation, self.requests, wake=lambda index: self.replicas[index].wake(),
            on_decode_arrival=self._on_decode_arrival)
        self._arrivals_done = False
        self._num_arrived = 0
        # Multi-turn sessions: their later turns, sent as the turns before them finish; None without sessions.
        self.later_turns = LaterTurns(self.requests) if any(spec.next_turns for spec in self.requests) else None
        if self.later_turns is not None and disaggregation is not None:
            raise ValueError("multi-turn sessions are simulated on replicas that prefill and decode, not on a "
                             "disaggregated cluster")
        # The client's limit on requests in flight (workload.max_concurrency); None: an open loop.
        self.client = None if max_concurrency is None else ConcurrencyLimit(max_concurrency)
        self._params_by_output_len: dict[int, SamplingParams] = {}
        # When the replicas next publish their counts to the router (published loads only).
        self._next_publish_time = float("inf")
        # The replica each request went to, in arrival order (a cluster's traces say it per request).
        self.replica_of_request: dict[str, int] = {}
        # Decode-only stretches between arrivals are advanced in one call to the core, which leaves
        # exactly the state (and the traces) the ordinary steps would: see engine/core/decode_fast_forward.py.
        # Not across replicas whose requests arrive at finishes (a session's next turn, a request the client held):
        # one replica's finish may send a request to another in the middle of its stretch, which it cannot foresee.
        finishes_send = self.later_turns is not None or self.client is not None
        self.fast_forward = fast_forward and disaggregation is None and not (finishes_send and len(engines) > 1) \
            and expert_parallel is None
        # Data-parallel ranks in lockstep (sim/data_parallel_loop.py): a loop for each engine's ranks, and what the
        # lockstep cost them; None: a loop for each replica.
        self.expert_parallel = expert_parallel
        self.lockstep_stats: LockstepStats | None = None
        for replica in self.replicas:
            if replica.engine.scheduler.kv_cache_manager.offload is not None:
                if host_link is None or disaggregation is not None:
                    raise ValueError("an engine with a host tier (KV offloading) needs a host_link and no "
                                     "disaggregated cluster")
                replica.host_loads = HostLoads(self.env, host_link, replica.engine.scheduler, replica.wake)
                replica.recorder.offload_loads = replica.host_loads
        if disaggregation is not None and any(_batch_queue_depth(replica) > 1 for replica in self.replicas):
            raise ValueError("a disaggregated cluster's engines are simulated one batch at a time (without "
                             "engine.pipeline_parallel_size or engine.async_scheduling)")
        if autoscaling is not None and disaggregation is not None:
            raise ValueError("autoscaling is simulated for clusters whose replicas prefill and decode")
        self.autoscaler = None if autoscaling is None else Autoscaler(self.env, autoscaling, engines)
        # The autoscaler's replica-seconds and timeline once run() is done (None without autoscaling).
        self.autoscaling_stats: AutoscalingStats | None = None
        self.num_fast_forwarded_steps = 0
        self._progress = tqdm(total=count_requests(self.requests), desc=description, unit="req", disable=not progress,
                              mininterval=0.5, leave=False)
        # Finished requests not yet on the progress bar (it is updated every 64: each update costs).
        self.unreported_finished = 0

    def run(self) -> TraceRecorder | ClusterTrace:
        """The traces: one engine's recorder, or a cluster's traces with each row's replica."""
        self.env.process(self._arrivals())
        if self._published_loads():
            self.env.process(self._publish_loads())
        if self.autoscaler is not None:
            self.env.process(self.autoscaler.run(self._routing_done))
        if self.expert_parallel is not None:  # each data-parallel engine's ranks: consecutive replicas
            ranks = self.expert_parallel.data_parallel_size
            self.lockstep_stats = LockstepStats(ranks)
            loops = [self.env.process(data_parallel_loop(self, self.replicas[first:first + ranks],
                                                         self.expert_parallel, self.lockstep_stats))
                     for first in range(0, len(self.replicas), ranks)]
        else:
            loops = [self.env.process(self._engine_loop(index, replica) if _batch_queue_depth(replica) == 1
                                      else pipelined_engine_loop(self, replica, replica.executor.cost_model,
                                                                 _batch_queue_depth(replica)))
                     for index, replica in enumerate(self.replicas)]
        self.env.run(until=simpy.AllOf(self.env, loops))
        if self.autoscaler is not None:
            self.autoscaling_stats = self.autoscaler.stats(self.env.now)
        self._progress.update(self.unreported_finished)
        self._progress.close()
        if len(self.replicas) == 1:
            return self.replicas[0].recorder
        replica_of_request = self.replica_of_request
        if self.disaggregation is not None:
            decode_replica_of = self.disaggregation.decode_replica_of
            replica_of_request = {request_id: decode_replica_of.get(request_id, prefill)
                                  for request_id, prefill in replica_of_request.items()}
        trace = ClusterTrace([replica.recorder for replica in self.replicas], replica_of_request, self.disaggregation,
                            self.autoscaling_stats)
        trace.lockstep = self.lockstep_stats
        return trace

    def _published_loads(self) -> list[ReplicaLoads]:
        """The loads that publish every stats_interval_s (none when they are read live)."""
        if self.disaggregation is not None:
            every = [self.disaggregation.prefill_loads, self.disaggregation.decode_loads]
        else:
            every = [self.loads] if self.router is not None else []
        return [loads for loads in every if loads.published]

    def _on_decode_arrival(self, index: int, spec: RequestSpec) -> None:
        replica = self.replicas[index]
        replica.recorder.on_arrival(spec.request_id, spec.arrival_time, len(spec.prompt_token_ids), spec.priority,
                                    spec.request_class)
        replica.executor.add_prompt(spec.request_id, spec.prompt_token_ids)

    @property
    def now(self) -> float:
        return self.env.now

    @property
    def arrivals_done(self) -> bool:
        return self._arrivals_done

    def count_finished(self, outputs, time: float) -> None:
        """Count the requests these outputs finish at ``time``, for the progress bar, and let the client react to
        each (every engine loop reports here)."""
        reacts = self.client is not None or self.later_turns is not None
        for output in outputs:
            if output.finish_reason is not None:
                self.unreported_finished += 1
                if reacts:
                    self.on_request_finished(output.request_id, time)
        if self.unreported_finished >= 64:
            self._progress.update(self.unreported_finished)
            self.unreported_finished = 0

    def _arrivals(self):
        """Add each request at its arrival time. Requests arriving at the same instant are added
        together before the engine can wake, as a real driver injects them (see wall_clock_driver.py)."""
        env, requests, replicas = self.env, self.requests, self.replicas
        index = 0
        while index < len(requests):
            arrival_time = requests[index].arrival_time
            if arrival_time > env.now:
                yield env.timeout(arrival_time - env.now)
            woken: set[int] = set()
            while index < len(requests) and requests[index].arrival_time <= arrival_time:
                woken.add(self._arrive(requests[index]))
                index += 1
                self._num_arrived = index
            for chosen in woken - {None}:
                replicas[chosen].wake()
        self._num_arrived = len(requests)
        self._end_arrivals_if_done()

    def _end_arrivals_if_done(self) -> None:
        """Once no request will arrive any more (the stream's, the sessions' later turns, those the client holds),
        every replica loop may end when its engine is idle."""
        if (self._num_arrived == len(self.requests) and not self._arrivals_done
                and (self.later_turns is None or self.later_turns.outstanding == 0)
                and (self.client is None or not self.client.waiting)):
            self._arrivals_done = True
            for replica in self.replicas:
                replica.wake()

    def _arrive(self, spec: RequestSpec) -> int | None:
        """``spec`` arrived: send it, unless the client holds it for a free slot. The replica to wake, or None."""
        if self.client is not None and self.client.offer(spec) is None:
            return None
        return self._admit(spec)

    def _admit(self, spec: RequestSpec) -> int:
        """Route ``spec``'s request to a replica and add it there; the replica's index (the caller wakes it)."""
        if self.disaggregation is not None:
            request = self.disaggregation.make_prefill_request(spec)
            chosen = self.disaggregation.route_arrival(request)
        else:
            request = make_request(spec, self._params_by_output_len)
            if self.router is None:
                chosen = 0
            elif self.autoscaler is None:
                chosen = checked_choice(self.router, request, self._engines, self.loads)
            else:
                routable = self.autoscaler.routable
                self.loads.select(routable)
                chosen = routable[checked_choice(self.router, request, [self._engines[index] for index in routable],
                                                 self.loads)]
        replica = self.replicas[chosen]
        self.replica_of_request[spec.request_id] = chosen
        # The workload's own time, not env.now (which may differ from it in the last bit).
        replica.recorder.on_arrival(spec.request_id, spec.arrival_time, len(spec.prompt_token_ids),
                                    spec.priority, spec.request_class, spec.lora_name, spec.session_id, spec.turn,
                                    spec.client_wait_s)
        if spec.images:
            replica.recorder.note_images(spec.request_id, spec.images)
        replica.executor.add_prompt(spec.request_id, spec.prompt_token_ids)
        replica.engine.add_request(request)
        if self.later_turns is not None:
            self.later_turns.track(spec, request)
        return chosen

    def on_request_finished(self, request_id: str, finish_time: float) -> None:
        """A request finished: the client sends a request it held in the freed slot, then the session's next turn,
        if any, arrives after its think time. What is due now joins before the engine's next step, as the
        wall-clock driver adds it (the same order: the held request first)."""
        if self.client is not None:
            sent = self.client.on_finished(finish_time)
            if sent is not None:
                self.replicas[self._admit(sent)].wake()
        if self.later_turns is not None:
            turn = self.later_turns.on_finished(request_id, finish_time)
            if turn is not None and turn.arrival_time <= self.env.now:
                self._arrive_later_turn(turn)
            elif turn is not None:
                self.env.process(self._later_turn_arrival(turn))
        self._end_arrivals_if_done()

    def _later_turn_arrival(self, turn: RequestSpec):
        yield self.env.timeout(turn.arrival_time - self.env.now)
        self._arrive_later_turn(turn)

    def _arrive_later_turn(self, turn: RequestSpec) -> None:
        self.later_turns.on_arrived()
        chosen = self._arrive(turn)
        if chosen is not None:
            self.replicas[chosen].wake()
        self._end_arrivals_if_done()

    def _routing_done(self) -> bool:
        """No request will be routed any more: every one has arrived and, in a disaggregated cluster, has been
        handed to its decode replica (or ended at its prefill)."""
        return self._arrivals_done and (self.disaggregation is None or self.disaggregation.all_settled)

    def _publish_loads(self):
        """Every stats_interval_s from t = 0, the replicas publish their counts, until no request is routed
        any more (a disaggregated cluster routes hand-offs to its decode replicas after the last arrival)."""
        published = self._published_loads()
        while not self._routing_done():
            for loads in published:
                loads.publish()
            interval = published[0].stats_interval_s
            self._next_publish_time = self.env.now + interval
            yield self.env.timeout(interval)
        self._next_publish_time = float("inf")

    def _engine_loop(self, index: int, replica: Replica):
        env, engine, executor, recorder = self.env, replica.engine, replica.executor, replica.recorder
        scheduler = engine.scheduler
        count_finished = self.count_finished
        disaggregation = self.disaggregation
        # A prefill replica's finished requests are handed on (and counted where they finish, at the decode).
        hands_off = disaggregation is not None and disaggregation.is_prefill(index)
        gets_handoffs = disaggregation is not None and not hands_off
        while True:
            if not engine.has_work():
                self.on_replica_idle(replica)
                no_more_work = self._arrivals_done and (not gets_handoffs or disaggregation.all_settled)
                if no_more_work:
                    return
                yield from replica.sleep(env)
                continue
            if self.fast_forward:
                plan = DecodeFastForward.try_plan(scheduler, executor.token_id, executor.token_ids_by_request)
                if plan is not None:
                    planned = plan_durations(self, plan, executor)
                    if planned[0]:
                        result = plan.apply(len(planned[0]))
                        if result.num_steps:
                            yield from fast_forward(self, replica, result, *planned)
                            continue
            start = env.now
            result = engine.step()
            scheduler_output = result.scheduler_output
            if scheduler_output is not None and scheduler_output.preempted_req_ids:
                check_preemptions(scheduler, scheduler_output, start)
            if scheduler_output is not None and scheduler_output.kv_loads:
                if disaggregation is not None:
                    disaggregation.start_loads(index, scheduler_output.kv_loads)
                else:
                    replica.host_loads.start_loads(scheduler_output.kv_loads)
            if scheduler_output is None or scheduler_output.total_num_scheduled_tokens == 0:
                recorder.on_outputs(result.outputs, start)
                if hands_off:
                    disaggregation.on_prefill_outputs(result.outputs, start)
                else:
                    count_finished(result.outputs, start)
                if scheduler_output is not None and scheduler_output.preempted_req_ids:
                    # Progress without a token: the running request that needed a block was its own
                    # victim (the lowest priority), and its blocks are free for the next step.
                    recorder.on_empty_step(scheduler_output)
                elif scheduler_output is not None and scheduler.has_kv_transfers_in_flight():
                    # Its waiting requests wait on KV transfers (loads to arrive, or sends to free blocks). The
                    # loads this step started looked up the prefix cache: the next recorded step counts them.
                    recorder.on_empty_step(scheduler_output)
                    yield from replica.sleep(env)
                elif scheduler.has_unfinished_requests() and scheduler_output is not None:
                    raise SchedulerStalledError(
                        f"at t={start:.6f}s {len(scheduler.waiting)} requests wait and none was scheduled")
                continue
            duration = executor.last_duration
            # The queue and pool as the step leaves them, before arrivals during the step join.
            recorder.on_step(start, duration, scheduler_output, executor.last_features, scheduler)
            yield env.timeout(duration)
            now = env.now
            outputs = result.outputs
            recorder.on_outputs(outputs, now)
            if hands_off:
                disaggregation.on_prefill_outputs(outputs, now)
                continue
            count_finished(outputs, now)

    def on_replica_idle(self, replica: Replica) -> None:
        """``replica``'s loop found no work: a draining replica of an autoscaled cluster stops."""
        if self.autoscaler is not None:
            self.autoscaler.on_idle(self.replicas.index(replica))

    def next_event_time(self) -> float:
        """Where every replica's fast-forward stops: the next arrival (any replica may get it) and the
        next publication of the loads and the autoscaler's next decision (they read every replica's state,
        which a fast-forward has already advanced to the end of its planned steps)."""
        next_time = self._next_publish_time
        if self.autoscaler is not None:
            next_time = min(next_time, self.autoscaler.next_decision_time)
        if self.later_turns is not None:
            next_time = min(next_time, self.later_turns.next_arrival())
        if self._num_arrived < len(self.requests):
            return min(self.requests[self._num_arrived].arrival_time, next_time)
        return next_time

def _batch_queue_depth(replica: Replica) -> int:
    """Batches the replica's engine keeps in flight, as vLLM's batch queue: one per pipeline stage, two with
    async scheduling (the step running and the next one), else one."""
    stages = getattr(replica.executor.cost_model, "pipeline_parallel_size", 1)
    if stages > 1:
        return stages
    return 2 if replica.engine.scheduler.async_scheduling else 1
