"""The engine thread: the one thread that touches the ``EngineCore`` and the output processor.

    event loop(s)                           engine thread
    AsyncLLM.generate ── add / abort ──>    command queue (thread-safe)
                                             │ drained before every step; blocks when idle
                                             v
                                            EngineCore.step()  (schedule, run the model, update)
                                            OutputProcessor    (detokenize, stop strings, logprobs)
    RequestOutputCollector <── call_soon_threadsafe, one call per step and event loop

Owning the core and the output processor from one thread keeps both lock-free, and lets a stop
string finish its request in the core in the same step that found it. The thread steps while there is
work and sleeps on the queue otherwise, so an idle server costs nothing.

Failure handling keeps the engine serving:
- a bad add (a duplicate id) fails that request's iterator only;
- a step that raises (a model error) fails the requests in flight, frees all their blocks, drops the
  prefix cache (its newest blocks may hold KV that was never written), and the loop goes on;
- an event loop that has closed can no longer receive outputs: its requests are aborted;
- a bug in the loop itself kills the thread: every waiting iterator gets ``EngineDeadError``.

Shutdown aborts every request in flight, reports them finished with ``abort``, then ends the thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import logging
import queue
import threading
from collections import defaultdict
from dataclasses import dataclass

from engine.core import Request
from engine.engine_components import EngineComponents
from engine.engine_stats import EngineStats
from engine.front_end_step import step_front_end
from engine.output_collector import RequestOutputCollector
from engine.output_processor import OutputProcessor
from engine.outputs import RequestOutput

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine thread is gone (shut down, or died of an error): no request can be served."""


class EngineStepError(RuntimeError):
    """A step failed; every request in it failed with this error (the engine itself keeps serving)."""


@dataclass(slots=True)
class _AddRequest:
    request: Request
    prompt_text: str | None
    collector: RequestOutputCollector


@dataclass(slots=True)
class _AbortRequests:
    request_ids: list[str]


@dataclass(slots=True)
class _ResetPrefixCache:
    done: concurrent.futures.Future  # True: forgotten; False: requests still hold blocks


class _Shutdown:
    pass


class EngineLoop:
    def __init__(self, components: EngineComponents, output_processor: OutputProcessor, stats: EngineStats) -> None:
        self.engine_core = components.engine_core
        self.executor = components.executor
        self.output_processor = output_processor
        self.stats = stats
        self.dead_error: EngineDeadError | None = None
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        # Held while adding a request and while the ending thread drains the queue, so that no request
        # can slip into the queue after the last drain and wait forever.
        self._closing_lock = threading.Lock()
        self._closed = False
        # Engine-thread-only: where each request's outputs go.
        self._collectors: dict[str, RequestOutputCollector] = {}
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)

    # ------------------------------------------------------------------ any thread

    def start(self) -> None:
        self._thread.start()

    def add_request(self, request: Request, prompt_text: str | None, collector: RequestOutputCollector) -> None:
        with self._closing_lock:
            if self._closed:
                raise self.dead_error or EngineDeadError("the engine thread is not running")
            self._commands.put(_AddRequest(request, prompt_text, collector))

    def abort(self, request_ids: list[str]) -> None:
        self._commands.put(_AbortRequests(request_ids))

    def reset_prefix_cache(self) -> concurrent.futures.Future:
        """Forget every cached prefix between two steps; the future says whether it was done (refused while any
        request holds blocks)."""
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._commands.put(_ResetPrefixCache(done))
        return done

    def request_shutdown(self) -> None:
        self._commands.put(_Shutdown())

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread to end; True if it has."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive() and self.dead_error is None

    # ------------------------------------------------------------------ the engine thread

    def _run(self) -> None:
        try:
            running = True
            while running:
                running = self._handle_commands(block=not self.engine_core.has_work())
                if self.engine_core.has_work():
                    self._step()
            # Shut down: report the aborted requests, then refuse whatever is still queued.
            while self.engine_core.has_work():
                self._step()
            self.dead_error = EngineDeadError("the engine has been shut down")
            self._fail_everything(self.dead_error)
        except BaseException as error:  # a bug here must not leave iterators waiting forever
            logger.exception("the engine thread died")
            self.dead_error = EngineDeadError(f"the engine thread died: {error!r}")
            self.dead_error.__cause__ = error
            self._fail_everything(self.dead_error)

    def _handle_commands(self, block: bool) -> bool:
        """Apply queued commands (waiting for one if ``block``); False once shutdown was asked for."""
        try:
            command = self._commands.get() if block else self._commands.get_nowait()
        except queue.Empty:
            return True
        while True:
            if isinstance(command, _AddRequest):
                self._add(command)
            elif isinstance(command, _AbortRequests):
                # The core reports each abort as an output of the next step; the output processor turns
                # it into the request's final output (finish_reason "abort").
                self.engine_core.abort_requests(command.request_ids)
            elif isinstance(command, _ResetPrefixCache):
                command.done.set_result(self.engine_core.scheduler.reset_prefix_cache())
            else:
                self.engine_core.abort_requests(list(self.engine_core.scheduler.requests))
                return False
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return True

    def _add(self, command: _AddRequest) -> None:
        request = command.request
        request_id = request.request_id
        if request_id in self._collectors:
            self._deliver({command.collector.loop: [(command.collector, ValueError(
                f"request_id {request_id!r} is already being served"))]})
            return
        try:
            self.output_processor.add_request(request_id, command.prompt_text, list(request.prompt_token_ids),
                                              request.sampling_params, request.arrival_time,
                                              command.collector.output_kind)
            try:
                self.engine_core.add_request(request)
            except BaseException:
                self.output_processor.abort_requests([request_id])
                raise
        except Exception as error:
            self._deliver({command.collector.loop: [(command.collector, error)]})
            return
        self._collectors[request_id] = command.collector

    def _step(self) -> None:
        engine_core, output_processor = self.engine_core, self.output_processor
        scheduler = engine_core.scheduler
        try:
            result, processed = step_front_end(engine_core, output_processor, self.executor.take_prompt_logprobs,
                                               self.executor.take_pooler_output)
        except Exception as error:
            logger.exception("an engine step failed; failing the requests in flight")
            step_error = EngineStepError(f"the engine step failed: {error!r}")
            step_error.__cause__ = error
            self._fail_requests_in_flight(step_error)
            return
        outputs = processed.request_outputs
        self.stats.record_step(scheduler, sum(len(o.new_token_ids) for o in result.outputs), outputs)
        by_loop: dict[asyncio.AbstractEventLoop, list] = defaultdict(list)
        collectors = self._collectors
        for output in outputs:
            # The metrics object keeps changing in this thread; the consumer gets its own copy.
            output.metrics = copy.copy(output.metrics)
            collector = collectors.pop(output.request_id, None) if output.finished \
                else collectors.get(output.request_id)
            if collector is not None:
                completion = output.outputs[0]
                if collector.output_kind == "cumulative" and completion.logprobs is not None:
                    # A cumulative output hands out the request's own logprobs list, which keeps growing.
                    completion.logprobs = list(completion.logprobs)
                by_loop[collector.loop].append((collector, output))
        self._deliver(by_loop)

    def _deliver(self, by_loop: dict) -> None:
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver_on_loop, items)
            except RuntimeError:
                # The event loop is closed: nobody will read these requests again.
                orphans = [rid for rid, collector in self._collectors.items() if collector.loop is loop]
                for request_id in orphans:
                    del self._collectors[request_id]
                self.engine_core.abort_requests(orphans)

    def _fail_requests_in_flight(self, error: BaseException) -> None:
        scheduler = self.engine_core.scheduler
        request_ids = list(scheduler.requests)
        self.engine_core.abort_requests(request_ids)
        scheduler.take_pending_outputs()  # the error is their answer, not an abort
        tracked = list(self.output_processor.request_states)
        self.output_processor.abort_requests(tracked)
        self.stats.record_failed(tracked)
        scheduler.reset_prefix_cache()
        self.stats.record_scheduler(scheduler)
        self._fail_collectors(error)

    def _fail_everything(self, error: BaseException) -> None:
        """The thread is ending: every request still waiting, queued or not, gets ``error``."""
        orphans = []
        with self._closing_lock:
            self._closed = True
            while True:
                try:
                    command = self._commands.get_nowait()
                except queue.Empty:
                    break
                if isinstance(command, _AddRequest):
                    orphans.append(command.collector)
        self._fail_collectors(error, orphans)

    def _fail_collectors(self, error: BaseException, more: list[RequestOutputCollector] = ()) -> None:
        by_loop: dict = defaultdict(list)
        for collector in [*self._collectors.values(), *more]:
            by_loop[collector.loop].append((collector, error))
        self._collectors.clear()
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver_on_loop, items)
            except RuntimeError:
                pass  # a closed loop has no one left to tell


def _deliver_on_loop(items: list[tuple[RequestOutputCollector, RequestOutput | BaseException]]) -> None:
    """Runs on the event loop: hand each output (or error) to its request's collector."""
    for collector, item in items:
        if isinstance(item, BaseException):
            collector.put_error(item)
        else:
            collector.put(item)
