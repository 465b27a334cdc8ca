"""Hypothesis state machine for the scheduler driven through the scripted executor.

Random configurations (tiny pools that force preemption, chunked prefill on and off, both policies,
prefix caching on and off), random arrivals of random lengths with shared prefixes, and aborts at any
moment. After every rule: every DESIGN.md invariant. After every step: the token budget, the batch
size, slots for every scheduled token, no admissions in a step that preempted. At the end: every
request finished or aborted, every block free, and every request that ran to its length produced
exactly the tokens it would have produced alone (preemption and batching change nothing).

The engine also plays both halves of disaggregated prefill and decode (engine/core/kv_transfer.py):
some requests are a prefill engine's (their blocks outlive them until a send finishes), some a decode
engine's (their prompt KV is loaded, at any later moment, into blocks allocated for it). A loaded
request must still produce exactly the tokens it would have computed alone, and a loading request's
blocks must never be found by a prefix-cache hit before its KV is there.

With a host tier of the prefix cache (KV offloading, engine/core/kv_offload.py), a prompt whose prefix the
GPU's cache lost but the host's holds loads it the same way, at any later moment; every block the host is
given must have been computed by then, and loaded requests must still produce their own tokens.

Up to three batches may be in flight, as behind vLLM's batch queue under pipeline parallelism or async
scheduling (engine/core/batches_in_flight.py): a batch is scheduled and executed at once but its outputs are
applied later, in order, and further batches are scheduled meanwhile, with async scheduling taking the
positions of tokens still in flight. The tokens must still be each request's own.

With speculative decoding (engine/core/spec_decode.py) the executor proposes drafts that are partly right and
verifies the ones it is scheduled with: requests advance by several tokens in some steps, rejected positions are
taken back, and the tokens must still be each request's own; no block holding a rejected draft's KV may be
cached or copied to the host.

With LoRA (max_loras 1 or 2), requests name one of three adapters or none: the running requests never use more
than max_loras adapters, a prefix-cache hit only ever finds KV computed under the request's own adapter (the
scripted executor checks it), and every request still finishes with its own tokens.

Requests may show images (multimodal items: a run of placeholder tokens whose encoder output the decoder reads)
from a pool of four, so that requests share them, under small encoder budgets and caches, with and without
chunked items: the scripted executor keeps an encoder cache as a runner does and checks that no chunk computes an
item's placeholders without its encoder output, that no item is encoded while its output is kept, and that a
prefix-cache hit finds KV computed with the request's own images; its cache must equal the scheduler's ledger.

The prefix cache evicts by vLLM's LRU in most runs, by least-frequently-used in the others
(engine/core/eviction_policies.py): every check above holds under either.
"""

from __future__ import annotations

from collections import deque

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from engine.core import RequestStatus
from engine.core.lora import LoRARequest
from engine.core.multimodal import MultiModalFeature

from tests.core.helpers import (check_cached_blocks_were_computed, check_scheduler_invariants, expected_tokens,
                                make_core, make_request)

PREFIXES = [list(range(3000, 3000 + 40)), list(range(4000, 4000 + 13)), []]
# Images and their encoder output's length (an image always encodes to the same number of tokens). Two have the
# same length: their placeholder tokens are the same, so only the block hashes' image keys keep their KV apart.
IMAGES = {"cat": 5, "cow": 5, "map": 30, "dot": 1}
IMAGE_TOKEN_ID = 4999
# Sampled with the executor's eos_probability (0 in most runs): a request may stop before its length.
EOS_TOKEN_ID = 2


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(
        num_gpu_blocks=st.integers(4, 48), block_size=st.sampled_from([2, 4, 16]),
        max_num_seqs=st.integers(1, 8), max_num_batched_tokens=st.integers(4, 160),
        max_model_len=st.integers(16, 400), chunked=st.booleans(), threshold=st.sampled_from([0, 0, 7, 33]),
        policy=st.sampled_from(["fcfs", "priority", "shortest_prompt_first", "shortest_output_first"]),
        caching=st.booleans(),
        max_in_flight=st.sampled_from([1, 2, 3]), async_scheduling=st.booleans(),
        eos_probability=st.sampled_from([0.0, 0.0, 0.05]), offload_blocks=st.sampled_from([0, 0, 3, 12, 200]),
        speculative_tokens=st.sampled_from([0, 0, 1, 3]), draft_acceptance=st.sampled_from([0.3, 0.8]),
        lookahead=st.booleans(),
        max_loras=st.sampled_from([0, 0, 1, 2]), sliding_window=st.sampled_from([None, None, None, 1, 5, 24]),
        kv_cache_groups=st.sampled_from([None] * 5 + [(None, 5), (7, None, 7), (None, 24, 24), (1, None)]),
        chunked_groups=st.booleans(),
        encoder_budget=st.sampled_from([None, 6, 30, 47]), encoder_cache=st.sampled_from([None, 30, 35, 64]),
        disable_chunked_mm_input=st.sampled_from([False, False, True]),
        eviction_policy=st.sampled_from(["lru", "lru", "lfu"]))
    def setup(self, num_gpu_blocks, block_size, max_num_seqs, max_num_batched_tokens, max_model_len, chunked,
              threshold, policy, caching, max_in_flight, async_scheduling, eos_probability, offload_blocks,
              speculative_tokens, draft_acceptance, max_loras, sliding_window, kv_cache_groups, encoder_budget,
              encoder_cache, disable_chunked_mm_input, eviction_policy="lru", lookahead=False, chunked_groups=False):
        # A window hands back blocks and has the executor check every key read (a remote load's KV counts as
        # computed once finish_load delivers it); offloading is refused with one, so it is not drawn with it.
        # A hybrid KV cache (one table per group, the windowed ones handing blocks back) has the executor check
        # every group's reads; it takes neither offloading nor KV transfers, so neither is drawn with it. Its ints are
        # windows, or with chunked_groups one chunk (Llama 4's chunked layers: queries read their own chunk's keys).
        if kv_cache_groups is not None:
            sliding_window, offload_blocks = None, 0
        self.sliding_window = sliding_window
        self.hybrid = kv_cache_groups is not None
        # A draft model's lookahead is not drawn with KV transfers (the engines run neither beside the other).
        self.lookahead = lookahead and speculative_tokens > 0 and not async_scheduling
        self.core = make_core(num_gpu_blocks=num_gpu_blocks, block_size=block_size, max_num_seqs=max_num_seqs,
                              max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
                              enable_chunked_prefill=chunked, long_prefill_token_threshold=threshold, policy=policy,
                              enable_prefix_caching=caching, async_scheduling=async_scheduling,
                              eos_probability=eos_probability,
                              num_offload_blocks=offload_blocks if caching and sliding_window is None else 0,
                              sliding_window=sliding_window,
                              num_speculative_tokens=0 if async_scheduling else speculative_tokens,
                              # A draft model's lookahead slots (draft_model.py), as many as its drafts.
                              num_lookahead_tokens=speculative_tokens if self.lookahead else 0,
                              draft_acceptance=draft_acceptance, max_loras=max_loras, kv_cache_groups=kv_cache_groups,
                              chunked_groups=chunked_groups and kv_cache_groups is not None,
                              max_num_encoder_input_tokens=encoder_budget, encoder_cache_size=encoder_cache,
                              disable_chunked_mm_input=disable_chunked_mm_input, eviction_policy=eviction_policy)
        self.scheduler = self.core.scheduler
        manager = self.scheduler.kv_cache_manager
        if manager.offload is not None:
            manager.offload_computed = self.checked_offload(manager.offload_computed)
        self.prompts: dict[str, list[int]] = {}
        self.tokens: dict[str, list[int]] = {}
        self.finish: dict[str, str] = {}
        self.max_tokens: dict[str, int] = {}
        self.counter = 0
        self.time = 0.0
        self.max_in_flight = max_in_flight
        self.in_flight: deque = deque()
        self.host_content: dict[int, bytes | None] = {}  # what each host slot's last copy holds

    @rule(prefix=st.sampled_from(PREFIXES), suffix_len=st.integers(0, 120), max_tokens=st.integers(1, 24),
          priority=st.integers(0, 3), transfer=st.sampled_from(["none", "none", "remote_prefill", "remote_decode"]),
          lora_id=st.sampled_from([0, 0, 1, 2, 3]),
          images=st.lists(st.tuples(st.sampled_from(sorted(IMAGES)), st.sampled_from([0, 3, 20])), max_size=3))
    def add_request(self, prefix, suffix_len, max_tokens, priority, transfer, lora_id, images):
        if self.lookahead:
            transfer = "none"
        self.counter += 1
        self.time += 0.25
        request_id = f"r{self.counter}"
        prompt = list(prefix)
        features = []
        # Images go after the shared prefix, each after a few text tokens; KV transfers and the host tier take none.
        if transfer == "none" and not self.scheduler.cache_config.num_offload_blocks:
            for image, gap in images:
                prompt += [1000 + i for i in range(gap)]  # the same text in every request: prompts share blocks
                features.append(MultiModalFeature(image, len(prompt), IMAGES[image]))
                prompt += [IMAGE_TOKEN_ID] * IMAGES[image]
        prompt += [(self.counter * 7919 + i) % 5000 for i in range(suffix_len)]
        self.prompts[request_id] = prompt
        self.max_tokens[request_id] = max_tokens
        self.tokens[request_id] = []
        self.core.add_request(make_request(request_id, prompt, max_tokens=max_tokens, priority=priority,
                                           arrival_time=self.time, eos_token_id=EOS_TOKEN_ID,
                                           do_remote_prefill=transfer == "remote_prefill" and not self.hybrid,
                                           do_remote_decode=transfer == "remote_decode" and not self.hybrid,
                                           lora_request=LoRARequest(f"adapter-{lora_id}", lora_id)
                                           if lora_id and self.scheduler.max_loras else None,
                                           mm_features=features))

    def checked_offload(self, offload_computed):
        """The manager's copy of a request's blocks to the host, checking that each block it is given has all
        its KV computed by now (a block may not be in the GPU's prefix cache yet: under async scheduling its
        last token was a placeholder when it was scheduled)."""
        def checked(request, num_computed_tokens):
            manager = self.scheduler.kv_cache_manager
            first = manager.num_offloaded_block.get(request.request_id, 0)
            end = min(num_computed_tokens // manager.block_size, len(request.block_hashes))
            full = set(range(manager.block_size))
            for block in manager.get_blocks(request.request_id)[first:end]:
                assert self.core.executor.computed_slots.get(block.block_id) == full, \
                    "a block went to the host before its KV was computed"
            offload_computed(request, num_computed_tokens)
        return checked

    @rule(pick=st.integers(0, 10_000))
    def finish_load(self, pick):
        """A remote prefill's KV, or a host tier's blocks, arrive: the executor's slots for the loaded tokens
        now hold KV."""
        transfers = self.scheduler.kv_transfers
        pending = sorted(set(transfers.loading) - transfers.loaded)
        if not pending:
            return
        request_id = pending[pick % len(pending)]
        request = transfers.loading[request_id]
        manager = self.scheduler.kv_cache_manager
        blocks = manager.get_blocks(request_id)
        for position in range(request.num_computed_tokens, transfers.load_end[request_id]):
            block = blocks[position // manager.block_size]
            self.core.executor.computed_slots.setdefault(block.block_id, set()).add(position % manager.block_size)
        assert self.scheduler.finish_kv_load(request_id)
        check_cached_blocks_were_computed(self.scheduler, self.core.executor)

    @rule(pick=st.integers(0, 10_000))
    def finish_send(self, pick):
        sending = sorted(self.scheduler.kv_transfers.sending)
        if sending:
            assert self.scheduler.finish_kv_send(sending[pick % len(sending)])

    @rule()
    def evict_free_cached_blocks(self):
        """Other traffic's pressure, in short: every cached block no request holds leaves the GPU's prefix cache
        (as eviction would take it), while blocks in use stay. The host tier keeps what it holds."""
        pool = self.scheduler.kv_cache_manager.block_pool
        for block in list(pool.free_block_queue):
            if block.block_hash is not None:
                pool.uncache_block(block)

    @rule()
    def reset_prefix_cache(self):
        """The GPU's prefix cache is dropped (when no block is in use); a host tier keeps what it holds, so the
        next shared prefix loads from there."""
        self.scheduler.reset_prefix_cache()

    @rule(pick=st.integers(0, 10_000))
    def abort(self, pick):
        live = sorted(self.scheduler.requests)
        target = live[pick % len(live)] if live else "never-existed"
        self.core.abort_requests([target])

    @rule(ahead=st.sampled_from([False, True, True]))
    def step(self, ahead=False):
        """One whole step; with ``ahead``, a batch scheduled and executed whose outputs wait (while there is
        room in flight); with batches in flight and no ``ahead``, the oldest one's outputs applied."""
        if ahead and len(self.in_flight) < self.max_in_flight and self.scheduler.has_unfinished_requests():
            if not self.start_batch() and self.in_flight:
                # Nothing could be scheduled: wait for the oldest batch (what a batch queue's driver does).
                self.finish_batch()
            return
        if self.in_flight:
            self.finish_batch()
            return
        if not self.scheduler.has_unfinished_requests():
            self.collect(self.scheduler.take_pending_outputs())
            return
        self.start_batch()
        self.finish_batch()

    def start_batch(self):
        scheduler = self.scheduler
        output = scheduler.schedule()
        assert output.total_num_scheduled_tokens <= scheduler.max_num_batched_tokens
        assert output.total_num_scheduled_tokens == sum(output.num_scheduled_tokens.values())
        assert len(scheduler.running) <= scheduler.max_num_seqs
        if output.preempted_req_ids:
            assert not output.scheduled_new_reqs and not any(output.scheduled_cached_reqs.resumed_from_preemption)
        manager = scheduler.kv_cache_manager
        for request_id, count in output.num_scheduled_tokens.items():
            assert count > 0
            request = scheduler.requests[request_id]
            assert request.status == RequestStatus.RUNNING
            assert len(manager.req_to_blocks[request_id]) * manager.block_size >= request.num_computed_tokens
            placeholders = request.num_output_placeholders
            # Only async scheduling computes positions of tokens still in flight, one per batch at most.
            assert placeholders == 0 or scheduler.async_scheduling
            assert 0 <= placeholders <= len(self.in_flight) + 1
            drafts = output.scheduled_spec_decode_tokens.get(request_id, ())
            assert request.num_computed_tokens <= request.num_tokens + placeholders + len(drafts)
            if drafts:
                # Its last token and the drafts: nothing else of it is computed in this step.
                assert count == len(drafts) + 1 and request.num_computed_tokens == request.num_tokens + len(drafts)
            # Never a step past the request's length.
            assert request.num_tokens + placeholders - request.num_prompt_tokens <= max(request.max_tokens, 1)
            if scheduler.disable_chunked_mm_input:
                # No chunk ends inside an item, wherever it starts and whether the item's output is kept.
                assert not any(feature.offset < request.num_computed_tokens < feature.end
                               for feature in request.mm_features)
        check_scheduler_invariants(scheduler)
        self.check_host_copies(output)
        self.in_flight.append((output, self.core.executor.execute_model(output)))
        # The executor's encoder cache is the scheduler's ledger (it dropped what was evicted, encoded what was new).
        assert self.core.executor.encoder_outputs == set(scheduler.encoder_cache_manager.sizes)
        assert scheduler.batches_in_flight.num_in_flight == len(self.in_flight)
        if output.total_num_scheduled_tokens == 0 and len(self.in_flight) > 1:
            # An empty batch is finished at once, ahead of older ones, as the simulator's pipelined loop does.
            self.finish_batch(newest=True)
        return output.total_num_scheduled_tokens > 0

    def check_host_copies(self, output):
        """The host tier's copies, in the executor's order, before this step zeroes or writes a block: every
        block copied to the host holds computed KV, one copy per slot; every load reads a slot whose last copy
        holds the very block the request's prefix needs there."""
        manager = self.scheduler.kv_cache_manager
        full = set(range(self.scheduler.block_size))
        computed_slots = self.core.executor.computed_slots
        slots = [slot for _, slot in output.offload_stores]
        assert len(slots) == len(set(slots)), "two copies to one host slot in one step"
        for block_id, slot in output.offload_stores:
            assert computed_slots.get(block_id) == full, "a block went to the host before its KV was computed"
            self.host_content[slot] = manager.offload.hash_in_slot(slot)
        for request_id, pairs in output.offload_loads.items():
            request = self.scheduler.requests[request_id]
            first = request.num_computed_tokens // manager.block_size
            for index, (slot, _) in enumerate(pairs, first):
                assert self.host_content.get(slot) == request.block_hashes[index], "a load reads another block's KV"

    def finish_batch(self, newest=False):
        output, model_runner_output = self.in_flight.pop() if newest else self.in_flight.popleft()
        outputs = self.scheduler.update_from_output(output, model_runner_output)
        for each in outputs:
            if each.finish_reason == "length" or each.finish_reason == "stop" and not self.scheduler.async_scheduling:
                # A request that stops is in no later batch in flight (its blocks are freed now); under async
                # scheduling one that stops on a stop token may be, its next step scheduled on a placeholder.
                assert not any(each.request_id in later.num_scheduled_tokens for later, _ in self.in_flight)
        self.collect(outputs)
        check_cached_blocks_were_computed(self.scheduler, self.core.executor)

    def collect(self, outputs):
        for output in outputs:
            self.tokens[output.request_id].extend(output.new_token_ids)
            if output.finish_reason:
                assert output.request_id not in self.finish, "a request finished twice"
                self.finish[output.request_id] = output.finish_reason

    @invariant()
    def invariants_hold(self):
        if hasattr(self, "core"):
            check_scheduler_invariants(self.scheduler)
            stats = self.scheduler.spec_decoding_stats
            if stats is not None:
                # A position is judged only where one was proposed after every earlier one was kept: the
                # accepted at i are among the judged at i, and the judged at i + 1 among the accepted at i.
                accepted, judged = stats.num_accepted_tokens_per_position, stats.num_judged_tokens_per_position
                assert all(a <= j for a, j in zip(accepted, judged))
                assert all(j <= a for j, a in zip(judged[1:], accepted))
                assert judged[:1] == [stats.num_drafts] or stats.num_speculative_tokens == 0
                assert sum(accepted) == stats.num_accepted_tokens

    def teardown(self):
        if not hasattr(self, "core"):
            return
        # Run everything to the end, keeping as many batches in flight as the machine allows (the way a
        # batch queue drains a backlog), so most requests run their whole life behind a full queue.
        for _ in range(20_000):
            self.finish_load(0)
            self.finish_send(0)
            if not self.in_flight and not self.core.has_work() and not self.scheduler.has_kv_transfers_in_flight():
                break
            self.step(ahead=True)
        assert not self.scheduler.requests and not self.scheduler.running and not self.scheduler.waiting
        manager = self.scheduler.kv_cache_manager
        assert manager.num_free_blocks == manager.num_usable_blocks, "blocks leaked"
        encoder = self.scheduler.encoder_cache_manager
        assert not encoder.holders and encoder.num_reclaimable_slots == encoder.cache_size, "encoder cache leaked"
        assert set(self.finish) == set(self.prompts), "a request was lost"
        for request_id, reason in self.finish.items():
            produced = self.tokens[request_id]
            prompt = self.prompts[request_id]
            if reason in ("length", "stop"):
                assert produced == expected_tokens(self.core.executor, request_id, prompt, len(produced),
                                                   EOS_TOKEN_ID)
            if reason == "length":
                # Its whole length: the user's max_tokens, or the room its prompt leaves (one token at least).
                room = self.scheduler.max_model_len - len(prompt)
                assert len(produced) == max(1, min(self.max_tokens[request_id], room))
            elif reason == "stop":
                assert produced[-1] == EOS_TOKEN_ID and len(produced) <= self.max_tokens[request_id]
            elif reason == "ignored":
                assert produced == []
            else:
                assert reason == "abort"


SchedulerMachine.TestCase.settings = settings(max_examples=400, stateful_step_count=60, deadline=None)
TestSchedulerStateMachine = SchedulerMachine.TestCase

