"""A model-free executor for tests and benchmarks of the core.

It keeps the same per-request state a real runner keeps (token ids, computed counts, block tables),
rebuilt only from ``SchedulerOutput``s, and checks on every step that what the scheduler sent is
consistent: positions continue where the last step stopped, and block tables cover every slot written.
Tokens are a deterministic function of the sequence so far (like a greedy model), so a preempted and
recomputed request produces exactly the tokens it would have produced without preemption.

With ``num_speculative_tokens`` it also speculates: after each sampled token it proposes drafts whose first
ones are the true continuation (each with ``draft_acceptance`` probability, drawn from a hash) and the next one
wrong, and it verifies the drafts it is scheduled with as a real runner does: the matching ones are kept and
the true token follows. So speculation changes which steps produce a request's tokens, never the tokens.

With multimodal items it keeps an encoder cache as a runner does (drop what ``free_encoder_mm_hashes`` names,
then encode what ``scheduled_encoder_inputs`` names) and checks that no item is encoded while its output is kept
and that every chunk finds the output of every item whose placeholders it computes; and it records which items
each block's KV was computed with, so that a prefix-cache hit must find KV computed with the request's own images.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

from engine.core.outputs import ModelRunnerOutput
from engine.core.scheduler_output import SchedulerOutput


class ExecutorStateError(AssertionError):
    """The scheduler sent the runner something inconsistent."""


@dataclass(slots=True)
class _RequestState:
    token_ids: list[int]
    num_computed_tokens: int
    block_ids: list[int]
    eos_token_id: int | None
    salt: int = 0
    lora_int_id: int = 0  # 0: the base model
    mm_features: tuple = ()


@dataclass
class ScriptedExecutor:
    vocab_size: int = 32000
    seed: int = 0
    # Probability that the next token is EOS (for requests that carry an eos_token_id).
    eos_probability: float = 0.0
    block_size: int = 16
    validate: bool = True
    # The model's attention window, when every layer has one: then each step checks that every key its
    # queries read (the window before the first scheduled position) is KV this executor computed and that no
    # other request has overwritten since, which is what the KV-cache manager's handing back of
    # out-of-window blocks must preserve (a remote load's KV counts once the test marks its slots computed).
    # None: no such check.
    sliding_window: int | None = None
    # A hybrid KV cache (CacheConfig.kv_cache_groups): each group's window (None: full attention). Each request
    # then has one block table per group; every step writes each group's slots and checks, per group, that every
    # key its queries read (the window's, or all before them for a full group) is KV computed there.
    group_windows: tuple[int | None, ...] | None = None
    # The groups' ints are chunks (Llama 4's chunked local attention, CacheConfig.attention_chunk_size), not windows:
    # a query at position p reads the keys from p - p % chunk on.
    chunked_groups: bool = False
    states: dict[str, _RequestState] = field(default_factory=dict)
    num_steps: int = 0
    # The slots whose KV this executor has computed since their block was last (re)allocated, so that
    # tests can check every prefix-cached block really holds computed KV.
    computed_slots: dict[int, set[int]] = field(default_factory=dict)
    # The LoRA adapter (0: none) whose KV each block holds: a prefix hit must find its own adapter's KV.
    block_lora: dict[int, int] = field(default_factory=dict)
    num_speculative_tokens: int = 0
    draft_acceptance: float = 0.7
    # The items whose encoder output this executor keeps (identifiers), and the items each block's KV was computed
    # with (the identifiers overlapping its positions), for every block written since a request with items came.
    encoder_outputs: set[str] = field(default_factory=set)
    block_items: dict[int, tuple[str, ...]] = field(default_factory=dict)
    saw_items: bool = False

    def next_token(self, state: _RequestState) -> int:
        """A hash of (seed, request salt, position, last token): same history, same token."""
        position = len(state.token_ids)
        mixed = (state.salt * 0x9E3779B1 + position * 0x85EBCA77 + state.token_ids[-1] * 0xC2B2AE3D
                 + self.seed) & 0xFFFFFFFF
        mixed = (mixed ^ (mixed >> 15)) * 0x2C1B3C6D & 0xFFFFFFFF
        mixed ^= mixed >> 13
        if state.eos_token_id is not None and self.eos_probability > 0.0:
            if (mixed % 10_000) < self.eos_probability * 10_000:
                return state.eos_token_id
        return mixed % self.vocab_size

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        self.num_steps += 1
        states = self.states
        for block_id in scheduler_output.new_block_ids_to_zero:
            self.computed_slots[block_id] = set()
            self.block_lora.pop(block_id, None)
            self.block_items.pop(block_id, None)
        for request_id in scheduler_output.finished_req_ids:
            states.pop(request_id, None)
        for new_request in scheduler_output.scheduled_new_reqs:
            lora = new_request.lora_request
            state = states[new_request.req_id] = _RequestState(
                list(new_request.prompt_token_ids), new_request.num_computed_tokens, self._copy_table(new_request.block_ids),
                new_request.eos_token_id, zlib.crc32(new_request.req_id.encode()), lora.lora_int_id if lora else 0,
                new_request.mm_features)
            self.saw_items = self.saw_items or bool(new_request.mm_features)
            self._check_prefix_hit(new_request.req_id, state)
        cached = scheduler_output.scheduled_cached_reqs
        for index, request_id in enumerate(cached.req_ids):
            state = states.get(request_id)
            if state is None:
                raise ExecutorStateError(f"cached request {request_id} was never sent as new")
            if cached.resumed_from_preemption[index]:
                state.block_ids = self._copy_table(cached.new_block_ids[index])
                state.token_ids = list(cached.resumed_token_ids[request_id])
            elif cached.new_block_ids[index]:
                if self.group_windows is None:
                    state.block_ids.extend(cached.new_block_ids[index])
                else:
                    for table, new_ids in zip(state.block_ids, cached.new_block_ids[index]):
                        table.extend(new_ids)
            if self.validate and cached.num_computed_tokens[index] != state.num_computed_tokens and \
                    not cached.resumed_from_preemption[index]:
                raise ExecutorStateError(
                    f"{request_id}: scheduler says {cached.num_computed_tokens[index]} computed tokens, "
                    f"runner has {state.num_computed_tokens}")
            state.num_computed_tokens = cached.num_computed_tokens[index]
            if cached.resumed_from_preemption[index]:
                self._check_prefix_hit(request_id, state)

        if scheduler_output.free_encoder_mm_hashes or scheduler_output.scheduled_encoder_inputs:
            self._run_encoder(scheduler_output)
        req_ids = list(scheduler_output.num_scheduled_tokens)
        sampled: list[list[int]] = []
        block_size = self.block_size
        spec_decode_tokens = scheduler_output.scheduled_spec_decode_tokens
        proposals: dict[str, list[int]] = {}
        for request_id in req_ids:
            state = states[request_id]
            num_scheduled = scheduler_output.num_scheduled_tokens[request_id]
            drafts = spec_decode_tokens.get(request_id, ())
            end = state.num_computed_tokens + num_scheduled
            if self.validate:
                if end > len(state.token_ids) + len(drafts):
                    raise ExecutorStateError(f"{request_id}: scheduled past its known tokens")
                if drafts and end != len(state.token_ids) + len(drafts):
                    raise ExecutorStateError(f"{request_id}: drafts scheduled without the tokens before them")
                for window, table in self._tables(state):
                    if len(table) * block_size < end:
                        raise ExecutorStateError(f"{request_id}: {len(table)} blocks cannot hold {end} tokens")
                    if window is not None or self.group_windows is not None:
                        self._check_window_reads(request_id, table, window, end - num_scheduled)
                if state.mm_features:
                    self._check_encoder_reads(request_id, state, end - num_scheduled, end)
            block_lora = self.block_lora
            for _, table in self._tables(state):
                for position in range(end - num_scheduled, end):
                    block_id = table[position // block_size]
                    self.computed_slots.setdefault(block_id, set()).add(position % block_size)
                for block_id in table[(end - num_scheduled) // block_size:-(-end // block_size)]:
                    block_lora[block_id] = state.lora_int_id  # once per block written, not per position
                if self.saw_items:
                    first_block = (end - num_scheduled) // block_size
                    for index, block_id in enumerate(table[first_block:-(-end // block_size)], first_block):
                        self.block_items[block_id] = self._items_of_block(state, index)
            if end < len(state.token_ids) + len(drafts):
                state.num_computed_tokens = end
                sampled.append([])
                continue
            tokens = self._verify(state, drafts)
            # Rejected drafts' slots hold KV of tokens that are not the request's: stale until recomputed.
            for _, table in self._tables(state):
                for position in range(len(state.token_ids) - 1, end):
                    self.computed_slots[table[position // block_size]].discard(position % block_size)
            state.num_computed_tokens = len(state.token_ids) - 1
            sampled.append(tokens)
            if self.num_speculative_tokens:
                proposals[request_id] = self._propose(state)
        return ModelRunnerOutput(req_ids, {request_id: index for index, request_id in enumerate(req_ids)}, sampled,
                                 spec_token_ids=proposals)

    def _copy_table(self, block_ids):
        """A request's block table as sent (one list, or a tuple of one per group), copied to extend."""
        if self.group_windows is None:
            return list(block_ids)
        return [list(group) for group in block_ids]

    def _tables(self, state: _RequestState) -> list[tuple[int | None, list[int]]]:
        """(window, block ids) of each table of the request: one, or one per group of a hybrid KV cache."""
        if self.group_windows is None:
            return [(self.sliding_window, state.block_ids)]
        return list(zip(self.group_windows, state.block_ids))

    def _check_window_reads(self, request_id: str, table: list[int], window: int | None, first_position: int) -> None:
        """Every key the query at ``first_position`` reads before it (its window's; all of them without one) holds
        computed KV in ``table`` (later queries' windows start later and add only the step's own keys)."""
        block_size = self.block_size
        if window is None:
            first_key = 0
        elif self.chunked_groups:
            first_key = first_position - first_position % window
        else:
            first_key = max(0, first_position - window + 1)
        for position in range(first_key, first_position):
            block_id = table[position // block_size]
            if position % block_size not in self.computed_slots.get(block_id, ()):
                raise ExecutorStateError(f"{request_id}: its query at position {first_position} reads position "
                                         f"{position} in block {block_id}, whose KV is not computed there")

    def _check_prefix_hit(self, request_id: str, state: _RequestState) -> None:
        """The blocks a request starts with computed (its prefix-cache hit) hold KV of its own adapter, computed
        with its own multimodal items."""
        if not self.validate:
            return
        num_hit_blocks = -(-state.num_computed_tokens // self.block_size)
        for _, table in self._tables(state):
            for index, block_id in enumerate(table[:num_hit_blocks]):
                if self.block_lora.get(block_id, state.lora_int_id) != state.lora_int_id:
                    raise ExecutorStateError(f"{request_id} (LoRA {state.lora_int_id}) starts from block {block_id}, "
                                             f"computed under LoRA {self.block_lora[block_id]}")
                # (Not yet written: a hit on a block another request computes in this very step.)
                if block_id in self.block_items and self.block_items[block_id] != self._items_of_block(state, index):
                    raise ExecutorStateError(
                        f"{request_id} starts from block {block_id} (its block {index}), computed with items "
                        f"{self.block_items[block_id]}, not its own {self._items_of_block(state, index)}")

    def _items_of_block(self, state: _RequestState, index: int) -> tuple[str, ...]:
        start = index * self.block_size
        return tuple(feature.identifier for feature in state.mm_features
                     if feature.offset < start + self.block_size and feature.end > start)

    def _run_encoder(self, scheduler_output: SchedulerOutput) -> None:
        """Drop the evicted outputs, then encode this step's items: each only while its output is not kept."""
        outputs = self.encoder_outputs
        for identifier in scheduler_output.free_encoder_mm_hashes:
            if self.validate and identifier not in outputs:
                raise ExecutorStateError(f"told to drop encoder output {identifier!r}, which it does not keep")
            outputs.discard(identifier)
        for request_id, indices in scheduler_output.scheduled_encoder_inputs.items():
            features = self.states[request_id].mm_features
            for index in indices:
                identifier = features[index].identifier
                if self.validate and identifier in outputs:
                    raise ExecutorStateError(f"{request_id}: told to encode item {index} ({identifier!r}), whose "
                                             "output it keeps already")
                outputs.add(identifier)

    def _check_encoder_reads(self, request_id: str, state: _RequestState, start: int, end: int) -> None:
        """A chunk computing positions [start, end) reads the encoder output of every item it overlaps."""
        if not self.validate:
            return
        for feature in state.mm_features:
            if feature.offset < end and feature.end > start and feature.identifier not in self.encoder_outputs:
                raise ExecutorStateError(f"{request_id}: its chunk {start}-{end - 1} reads item {feature.identifier!r} "
                                         f"(positions {feature.offset}-{feature.end - 1}), whose encoder output it "
                                         "does not have")

    def _verify(self, state: _RequestState, drafts) -> list[int]:
        """Append the true tokens: each draft while it matches, then the true token after the last match."""
        tokens = []
        for draft in (*drafts, None):
            token = self.next_token(state)
            state.token_ids.append(token)
            tokens.append(token)
            if token != draft:
                break
        return tokens

    def _propose(self, state: _RequestState) -> list[int]:
        """Drafts for the next step: the true continuation while a hash-drawn coin says so, then a wrong one."""
        lookahead = _RequestState(list(state.token_ids), 0, [], state.eos_token_id, state.salt)
        drafts = []
        for _ in range(self.num_speculative_tokens):
            token = self.next_token(lookahead)
            lookahead.token_ids.append(token)
            coin = zlib.crc32(f"{state.salt}:{len(lookahead.token_ids)}:{self.seed}".encode()) % 1000
            if coin >= self.draft_acceptance * 1000:
                drafts.append((token + 1) % self.vocab_size)
                break
            drafts.append(token)
        return drafts
