"""Batches in flight: what the scheduler must know when it schedules before the last batch's tokens are back.

With pipeline parallelism vLLM keeps up to ``pipeline_parallel_size`` batches in flight (the engine's batch
queue, ``step_with_batch_queue``): it schedules the next batch while earlier ones still run on later stages,
and applies their outputs in the order they were scheduled. The scheduler needs no new state for most of
it, because a scheduled request's computed count advances at once:

- a decode whose token is still in flight has no token left to compute, so the next ``schedule()`` passes
  it over (0 new tokens), and it is scheduled again once its token is back;
- a prompt in the middle of its prefill can run its next chunk in the next batch, before the earlier chunk's
  batch is back (chunked prefills pipeline, as in vLLM).

What the outputs cannot say by themselves, this keeps:

- Which requests of a batch sample a token. A chunk that ends before its request's known tokens samples
  none (``SchedulerOutput.partial_prefill_req_ids``, fixed when the batch is scheduled: by the time a batch
  is back, a later batch may have advanced the count to the end of the prompt).
- Which requests ended (aborted, or stopped while scheduled again under async scheduling) after a batch
  holding them was scheduled: should a new request take the id meanwhile, it must not get their tokens.
- Which requests were preempted after a batch holding them was scheduled. Their blocks were freed and they
  will recompute from scratch, so the tokens those earlier batches sampled are dropped, and the recompute
  samples them again. vLLM appends them instead (each stage runs batches in order, so such a token was
  computed from intact KV). Dropping costs at most one token's recompute per preemption and keeps one rule:
  a request's tokens come from batches scheduled since it last started. With three or more batches in
  flight, a token appended while the request recomputes would otherwise join a sequence the runner has
  already been sent in full.

Invariants (the state machine checks them, with batches left in flight at random):
- batches with tokens are updated in the order they were scheduled (an empty one may be updated at once);
- a request that stops in a batch's update is in no later batch in flight (a batch that samples for a
  request leaves it no token to schedule until that batch is back), so finishing it frees no block a
  batch in flight still writes for it.
"""

from __future__ import annotations


class BatchesInFlight:
    def __init__(self) -> None:
        self.num_scheduled = 0
        # Indices of the batches scheduled and not yet updated, oldest first.
        self._in_flight: list[int] = []
        # Request id -> the batch index from which its tokens count again (preempted or ended before it).
        self._preempted_after: dict[str, int] = {}

    @property
    def num_in_flight(self) -> int:
        return len(self._in_flight)

    def start(self) -> int:
        """A batch has been scheduled: its index."""
        index = self.num_scheduled
        self.num_scheduled = index + 1
        self._in_flight.append(index)
        return index

    def drop_in_flight(self, request_id: str) -> None:
        """What the batches scheduled so far sampled for the request is dropped: it was preempted (called
        while the next batch is being scheduled), or it ended and a new request may take its id."""
        if len(self._in_flight):
            self._preempted_after[request_id] = self.num_scheduled

    def dropped(self, request_id: str, batch_index: int) -> bool:
        """Whether what batch ``batch_index`` sampled for the request is dropped (preempted since)."""
        preempted_in = self._preempted_after.get(request_id)
        return preempted_in is not None and preempted_in > batch_index

    @property
    def any_preempted(self) -> bool:
        return bool(self._preempted_after)

    def finish(self, batch_index: int) -> None:
        """Batch ``batch_index`` has been updated. An entry k drops the tokens of batches before k, so it is
        kept while one of them is still in flight (a driver may finish an empty batch before older ones)."""
        in_flight = self._in_flight
        if batch_index in in_flight:
            in_flight.remove(batch_index)
        if self._preempted_after:
            oldest = in_flight[0] if in_flight else self.num_scheduled
            for request_id in [request_id for request_id, index in self._preempted_after.items() if index <= oldest]:
                del self._preempted_after[request_id]
