"""The encoder cache: which multimodal items' encoder outputs the runner keeps, and the step's encoder budget.

vLLM V1 runs a vision encoder inside the step that first needs an item's embeddings, and keeps the output in
a cache of ``cache_size`` embeddings (tokens) until the decoder has read all of it into the KV cache, because a
chunked prefill may read an image's embeddings over several steps. This class is the scheduler's ledger of that
cache; the runner mirrors it: it computes the items ``SchedulerOutput.scheduled_encoder_inputs`` names and drops
those ``free_encoder_mm_hashes`` names.

An entry is keyed by the item's identifier (its content hash), so one output serves every request that shows
the same image. It is either *held* (by the running requests whose prefill is inside one of its items: they
read it in their next chunk) or *freeable* (no holder: kept, least recently released first, until space is
needed; vLLM's lazy freeing, so a popular image is encoded once while it stays). Within one ``schedule()`` an
entry allocated this step is *pending*: the runner computes it in this step for the first scheduled request
that holds it; should every holder drop out of the step (preempted, or its chunk not scheduled after all), it
was never computed, so it leaves the cache at once and its tokens go back to the step's budget.

Invariants (tests/core/helpers.py checks them after every step):
- ``num_free_slots == cache_size - sum(sizes of entries)`` and ``>= 0``;
  ``num_reclaimable_slots == num_free_slots + sum(sizes of freeable entries)``.
- An entry is freeable exactly when nobody holds it; nothing is pending between steps.
- A running request holds exactly the identifiers of its items that its prefill has started but not finished
  (``offset < num_computed_tokens < end``): those, and only those, its next chunk reads from the cache.
"""

from __future__ import annotations

from collections import OrderedDict

from engine.core.multimodal import MultiModalFeature
from engine.core.request import Request


class EncoderCacheManager:
    def __init__(self, cache_size: int) -> None:
        if cache_size < 1:
            raise ValueError(f"encoder cache_size must be >= 1 token, got {cache_size!r}")
        self.cache_size = cache_size
        self.sizes: dict[str, int] = {}                # every cached entry -> its tokens
        self.holders: dict[str, set[str]] = {}         # held entries -> the request ids holding them
        self.freeable: OrderedDict[str, int] = OrderedDict()  # unheld entries, least recently released first
        self.num_free_slots = cache_size
        self.num_reclaimable_slots = cache_size        # free, or taken by a freeable entry
        self.held_by_request: dict[str, set[str]] = {}
        # This step's encoder budget left, and the entries allocated in it (identifier -> tokens).
        self.budget_left = 0
        self.pending: dict[str, int] = {}
        # Identifiers evicted since the last schedule() took them: the runner drops their outputs.
        self.evicted: list[str] = []

    # ------------------------------------------------------------------ one step

    def begin_step(self, compute_budget: int) -> None:
        self.budget_left = compute_budget
        self.pending = {}

    def is_cached(self, identifier: str) -> bool:
        return identifier in self.sizes

    def holds(self, request_id: str, identifier: str) -> bool:
        return identifier in self.held_by_request.get(request_id, ())

    def hold(self, request_id: str, identifier: str) -> None:
        """Take a reference on a cached entry (reviving it from the freeable ones)."""
        holders = self.holders.get(identifier)
        if holders is None:
            size = self.freeable.pop(identifier)
            self.num_reclaimable_slots -= size
            holders = self.holders[identifier] = set()
        holders.add(request_id)
        self.held_by_request.setdefault(request_id, set()).add(identifier)

    def can_allocate(self, num_tokens: int, num_planned_tokens: int) -> bool:
        """Whether an item of ``num_tokens`` fits the step's budget and the cache, beside ``num_planned_tokens``
        the same request plans to allocate in this step; evicts freeable entries (oldest first) to make room."""
        needed = num_tokens + num_planned_tokens
        if needed > self.budget_left or needed > self.num_reclaimable_slots:
            return False
        while needed > self.num_free_slots:
            identifier, size = self.freeable.popitem(last=False)
            del self.sizes[identifier]
            self.num_free_slots += size
            self.evicted.append(identifier)
        return True

    def allocate(self, request_id: str, identifier: str, num_tokens: int) -> None:
        """An entry the runner computes in this step, held by ``request_id`` (can_allocate said it fits)."""
        if identifier in self.sizes:
            raise RuntimeError(f"encoder output {identifier!r} is cached already: hold it instead")
        self.sizes[identifier] = num_tokens
        self.num_free_slots -= num_tokens
        self.num_reclaimable_slots -= num_tokens
        self.budget_left -= num_tokens
        self.pending[identifier] = num_tokens
        self.holders[identifier] = set()
        self.hold(request_id, identifier)

    def release(self, request_id: str, identifier: str) -> None:
        """Drop ``request_id``'s reference. An unheld entry becomes freeable, or, if allocated in this step and
        so never computed, leaves the cache and gives its tokens back to the step's budget."""
        held = self.held_by_request.get(request_id)
        if held is None or identifier not in held:
            return
        held.discard(identifier)
        if not held:
            del self.held_by_request[request_id]
        holders = self.holders[identifier]
        holders.discard(request_id)
        if holders:
            return
        del self.holders[identifier]
        size = self.sizes[identifier]
        if identifier in self.pending:
            del self.pending[identifier]
            del self.sizes[identifier]
            self.num_free_slots += size
            self.num_reclaimable_slots += size
            self.budget_left += size
        else:
            self.freeable[identifier] = size
            self.num_reclaimable_slots += size

    def release_request(self, request: Request) -> None:
        """Drop every reference of a request that is preempted or ends."""
        for identifier in sorted(self.held_by_request.get(request.request_id, ())):
            self.release(request.request_id, identifier)

    def release_finished_items(self, request: Request) -> None:
        """Drop the references of a request whose prefill has left items behind (their KV is computed): it
        keeps those of items it is inside, which its next chunk reads."""
        held = self.held_by_request.get(request.request_id)
        if not held:
            return
        num_computed = request.num_computed_tokens
        still_read = {feature.identifier for feature in request.mm_features
                      if feature.offset < num_computed < feature.end}
        for identifier in sorted(held - still_read):
            self.release(request.request_id, identifier)

    def end_step(self, scheduled: list[tuple[Request, int]]) -> dict[str, list[int]]:
        """Assign each entry allocated in this step to the first scheduled request holding it, whose chunk
        (``num_computed_tokens - num_scheduled`` to ``num_computed_tokens``) reads it: the runner computes the
        item there. Returns request id -> indices of its items to encode, in prompt order."""
        pending = self.pending
        self.pending = {}
        if not pending:
            return {}
        assigned: dict[str, list[int]] = {}
        for request, num_scheduled in scheduled:
            if not pending:
                break
            held = self.held_by_request.get(request.request_id)
            if not held:
                continue
            start = request.num_computed_tokens - num_scheduled
            for index, feature in enumerate(request.mm_features):
                identifier = feature.identifier
                if identifier in pending and identifier in held and feature.offset < request.num_computed_tokens \
                        and feature.end > start:
                    del pending[identifier]
                    assigned.setdefault(request.request_id, []).append(index)
        if pending:
            raise RuntimeError(f"encoder outputs {sorted(pending)} were allocated in this step but no scheduled "
                               "request reads them")
        return assigned

    def take_evicted(self) -> list[str]:
        evicted, self.evicted = self.evicted, []
        return evicted


def plan_encoder_inputs(manager: EncoderCacheManager, request: Request, num_computed: int, num_new_tokens: int,
                        disable_chunked_mm_input: bool) -> tuple[int, list[MultiModalFeature], list[str]]:
    """What a chunk of ``num_new_tokens`` from ``num_computed`` needs from the encoder (vLLM's
    ``_try_schedule_encoder_inputs``): the items it reads that the cache holds are held at once (so that making
    room for another item cannot evict them); those it lacks must fit the step's budget and the cache, else the
    chunk is cut before the first that does not fit (possibly to nothing). With ``disable_chunked_mm_input`` a
    chunk never ends inside an item: it is cut before the item, or to nothing when it starts on or inside it (after
    a prefix hit that ends there) and cannot reach its end this step. That holds whether or not the item's output is
    kept already, which vLLM's check does not ask (its issue #52306: a chunk that starts on an item, or finds its
    output kept, may end inside it); a model whose image tokens attend each other both ways (Gemma 3) needs every
    item computed whole.

    Returns the (possibly cut) chunk, the items to allocate once the chunk is scheduled, and the identifiers held
    here, which the caller releases (``release``) if the chunk is not scheduled after all. (vLLM keeps such a
    reference until the request runs or ends; giving it back keeps the rule that only requests inside an item
    hold it, so a waiting request never pins the cache.)"""
    to_allocate: list[MultiModalFeature] = []
    newly_held: list[str] = []
    planned_identifiers: set[str] = set()
    num_planned_tokens = 0
    request_id = request.request_id
    end = num_computed + num_new_tokens
    for feature in request.mm_features:
        if feature.offset >= end:
            break
        if feature.end <= num_computed:
            continue  # its KV is computed (or a prefix-cache hit): the decoder reads no embedding of it
        if disable_chunked_mm_input and end < feature.end:
            num_new_tokens = max(feature.offset - num_computed, 0)
            break
        identifier = feature.identifier
        if identifier in planned_identifiers or manager.holds(request_id, identifier):
            continue
        if manager.is_cached(identifier):
            manager.hold(request_id, identifier)
            newly_held.append(identifier)
            continue
        if not manager.can_allocate(feature.length, num_planned_tokens):
            # The chunk stops before the item: the budget or the cache has no room for its encoder output.
            num_new_tokens = max(feature.offset - num_computed, 0)
            break
        to_allocate.append(feature)
        planned_identifiers.add(identifier)
        num_planned_tokens += feature.length
    return num_new_tokens, to_allocate, newly_held


def finish_encoder_step(encoder: EncoderCacheManager, requests: dict[str, Request], scheduler_output) -> None:
    """Tell the runner which items to encode (each new entry once, for the first scheduled request that reads it)
    and which outputs to drop; then the scheduled requests give back the items their prefill has passed."""
    scheduled = [(requests[request_id], count) for request_id, count in scheduler_output.num_scheduled_tokens.items()
                 if requests[request_id].mm_features]
    assigned = encoder.end_step(scheduled)
    scheduler_output.scheduled_encoder_inputs = assigned
    lengths = [requests[request_id].mm_features[index].length
               for request_id, indices in assigned.items() for index in indices]
    scheduler_output.encoder_input_lengths = lengths
    scheduler_output.num_encoder_tokens = sum(lengths)
    for request, _ in scheduled:
        encoder.release_finished_items(request)
    scheduler_output.free_encoder_mm_hashes = encoder.take_evicted()
