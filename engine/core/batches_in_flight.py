"""Batches in flight: what the scheduler must know when it schedules before the last batch's tokens are back.

With pipeline parallelism vLLM keeps up to ``pipeline_parallel_size`` batches in flight (the engine's batch
queue, ``step_with_batch_queue``): it schedules the next batch while earlier ones still run on later stages,
and applies their outputs in the order they were scheduled. The scheduler needs no new state for most of
it, because a scheduled request's computed count advances at once:

- a decode whose token is still in flight has no token left to compute, so the next ``schedule()`` passes
  it over (0 new tokens), and it is scheduled again once its token is back;
- a prompt in the middle of its prefill can run its next chunk in the next batch, before the earlier chunk's
  batch is back (chunked prefills pipeline, as in vLLM).

Async scheduling (``SchedulerConfig.async_scheduling``, vLLM's ``AsyncScheduler``) keeps two batches in
flight through one GPU, and schedules a decode whose token is in flight on that token's position instead
of passing it over: ``Request.num_output_placeholders`` counts such tokens, and the scheduler never
schedules a step that would compute past a request's length. Under async scheduling num_computed_tokens
may exceed num_tokens by the placeholders (an amendment to DESIGN's invariants, which otherwise all hold).

What the outputs cannot say by themselves, this keeps:

- Which requests of a batch sample a token. A chunk that ends before its request's known tokens samples
  none (``SchedulerOutput.partial_prefill_req_ids``, fixed when the batch is scheduled: by the time a batch
  is back, a later batch may have advanced the count to the end of the prompt).
- Which requests ended (aborted, or stopped while scheduled again under async scheduling) after a batch
  holding them was scheduled: should a new request take the id meanwhile, it must not get their tokens.
- Which requests were preempted, or resumed, after a batch holding them was scheduled. Such a batch's token
  was computed from intact KV (each stage runs batches in order, so the batch read the request's blocks
  before any later batch could reuse them), and, as vLLM does, it is appended while the request waits to
  resume: the recompute then covers it. But once the request has resumed, the runner has been sent its
  whole sequence as of that moment and the recompute samples that token again, so a token from a batch
  scheduled before the resume is dropped (possible with three or more batches in flight), even if the
  request has been preempted again by the time it comes back. (Dropping every such token would be simpler,
  but two requests evicting each other would then lose the token each had just sampled, every time, and
  never get ahead: async scheduling turned such a slow ping-pong into a livelock.)

Invariants (the state machine checks them, with batches left in flight at random):
- batches with tokens are updated in the order they were scheduled (an empty one may be updated at once);
- one batch queue slot holds one token per request: a decode in flight is passed over (pipelines) or
  scheduled on its placeholder (async scheduling), never past the request's length;
- a request that stops by its length is in no later batch in flight. One that stops on a stop token under
  async scheduling may be (its next step was scheduled before the token was known): that batch's token is
  dropped, and the blocks freed under it are reused only by batches that run after it.
"""

from __future__ import annotations


class BatchesInFlight:
    def __init__(self) -> None:
        self.num_scheduled = 0
        # Indices of the batches scheduled and not yet updated, oldest first.
        self._in_flight: list[int] = []
        # Request id -> the number of batches scheduled when it was preempted / resumed / ended while batches
        # were in flight. An entry k concerns the batches before k: a preempted request's tokens from them are
        # kept (so its status must be read), a resumed or ended one's are dropped.
        self._preempted_after: dict[str, int] = {}
        self._resumed_after: dict[str, int] = {}
        self._ended_after: dict[str, int] = {}

    @property
    def num_in_flight(self) -> int:
        return len(self._in_flight)

    def start(self) -> int:
        """A batch has been scheduled: its index."""
        index = self.num_scheduled
        self.num_scheduled = index + 1
        self._in_flight.append(index)
        return index

    def on_preempt(self, request_id: str) -> None:
        """Called while a batch is being scheduled (its index is ``num_scheduled``)."""
        if self._in_flight:
            self._preempted_after[request_id] = self.num_scheduled

    def on_resume(self, request_id: str) -> None:
        """Called while a batch is being scheduled: the request recomputes from its sequence as of now."""
        if self._in_flight:
            self._resumed_after[request_id] = self.num_scheduled

    def on_end(self, request_id: str) -> None:
        """The request has ended (finished or aborted); its id may be taken by a new request."""
        if self._in_flight:
            self._ended_after[request_id] = self.num_scheduled

    @property
    def any_changed(self) -> bool:
        """Whether some request was preempted, resumed or ended while batches were in flight (only then can
        a batch's request be waiting, or its token be dropped)."""
        return bool(self._preempted_after or self._resumed_after or self._ended_after)

    def dropped(self, request_id: str, batch_index: int) -> bool:
        """Whether what batch ``batch_index`` sampled for the request is dropped: the request has resumed
        since (it samples that token again), or ended (the id's request now is another one)."""
        resumed = self._resumed_after.get(request_id)
        if resumed is not None and resumed > batch_index:
            return True
        ended = self._ended_after.get(request_id)
        return ended is not None and ended > batch_index

    def may_bring_tokens(self, request_id: str) -> bool:
        """Whether a batch scheduled before the request's latest preemption may still be in flight: its token
        would then be appended while the request waits (conservative: the entry goes once those batches are
        updated)."""
        return request_id in self._preempted_after

    def finish(self, batch_index: int) -> None:
        """Batch ``batch_index`` has been updated. An entry k concerns the batches before k, so it is kept
        while one of them is still in flight (a driver may finish an empty batch before older ones)."""
        in_flight = self._in_flight
        if batch_index in in_flight:
            in_flight.remove(batch_index)
        oldest = in_flight[0] if in_flight else self.num_scheduled
        for entries in (self._preempted_after, self._resumed_after, self._ended_after):
            if entries:
                for request_id in [request_id for request_id, index in entries.items() if index <= oldest]:
                    del entries[request_id]
