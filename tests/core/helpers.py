"""Builders and invariant checks shared by the core tests."""

from __future__ import annotations

from collections import Counter

from engine.core import CacheConfig, EngineCore, Request, SamplingParams, Scheduler, SchedulerConfig, ScriptedExecutor
from engine.core.hybrid_kv_cache_manager import HybridKVCacheManager
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.request import RequestStatus


def make_core(*, num_gpu_blocks=1000, block_size=16, max_num_seqs=256, max_num_batched_tokens=8192,
              max_model_len=8192, enable_chunked_prefill=True, long_prefill_token_threshold=0, policy="fcfs",
              enable_prefix_caching=True, enable_kv_cache_events=False, eos_probability=0.0, seed=0,
              async_scheduling=False, num_offload_blocks=0, num_speculative_tokens=0, num_lookahead_tokens=0,
              draft_acceptance=0.7, max_loras=0, sliding_window=None, kv_cache_groups=None,
              max_num_encoder_input_tokens=None, encoder_cache_size=None, disable_chunked_mm_input=False,
              eviction_policy="lru", chunked_groups=False) -> EngineCore:
    """``chunked_groups``: the ints of ``kv_cache_groups`` are one chunk (Llama 4's chunked layers), not windows."""
    chunk = next((span for span in kv_cache_groups or () if span is not None), None) if chunked_groups else None
    scheduler = Scheduler(
        SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                        max_model_len=max_model_len, enable_chunked_prefill=enable_chunked_prefill,
                        long_prefill_token_threshold=long_prefill_token_threshold, policy=policy,
                        async_scheduling=async_scheduling, num_speculative_tokens=num_speculative_tokens,
                        num_lookahead_tokens=num_lookahead_tokens, max_loras=max_loras, max_num_encoder_input_tokens=max_num_encoder_input_tokens,
                        encoder_cache_size=encoder_cache_size, disable_chunked_mm_input=disable_chunked_mm_input),
        CacheConfig(block_size=block_size, num_gpu_blocks=num_gpu_blocks, enable_prefix_caching=enable_prefix_caching,
                    enable_kv_cache_events=enable_kv_cache_events, num_offload_blocks=num_offload_blocks,
                    sliding_window=sliding_window, kv_cache_groups=kv_cache_groups, eviction_policy=eviction_policy,
                    attention_chunk_size=chunk))
    executor = ScriptedExecutor(block_size=block_size, eos_probability=eos_probability, seed=seed,
                                num_speculative_tokens=num_speculative_tokens, draft_acceptance=draft_acceptance,
                                sliding_window=sliding_window, group_windows=kv_cache_groups,
                                chunked_groups=chunk is not None)
    return EngineCore(scheduler, executor)


def make_request(request_id: str, prompt, max_tokens=16, **kwargs) -> Request:
    sampling_keys = {"min_tokens", "stop_token_ids", "ignore_eos", "prompt_logprobs"}
    sampling = {key: kwargs.pop(key) for key in list(kwargs) if key in sampling_keys}
    return Request(request_id, list(prompt), SamplingParams(max_tokens=max_tokens, **sampling), **kwargs)


def check_kv_invariants(manager: KVCacheManager | HybridKVCacheManager) -> None:
    """Every invariant of DESIGN.md about blocks, given the manager's own request -> blocks map (a hybrid KV
    cache: every group's, from the one pool they share)."""
    pool = manager.block_pool
    groups = manager.groups if isinstance(manager, HybridKVCacheManager) else [manager]
    holders = Counter()
    for group in groups:
        _count_holders(group, pool, holders)
    if len(groups) > 1:
        # Every group's table of a request has group 0's length and cached count (the scheduler reads group 0's).
        for group in groups:
            assert group.block_pool is pool
            assert {request_id: len(blocks) for request_id, blocks in group.req_to_blocks.items()} == \
                {request_id: len(blocks) for request_id, blocks in manager.req_to_blocks.items()}
            assert group.num_cached_block == manager.num_cached_block
        # A cached block is cached under the tag of the group whose table holds it: its hash ends with that tag,
        # and less the tag is as long as every plain hash (group 0's tag is empty).
        plain_lengths = set()
        for group in groups:
            for blocks in group.req_to_blocks.values():
                for block in blocks:
                    if block.block_hash is not None and not block.is_null:
                        assert block.block_hash.endswith(group.hash_tag), f"{block} cached under another group's tag"
                        plain_lengths.add(len(block.block_hash) - len(group.hash_tag))
        assert len(plain_lengths) <= 1, f"cached under another group's tag: hash lengths less tags {plain_lengths}"
        # A block holds one group's layers: no block is in two groups' tables.
        owner: dict[int, int] = {}
        for index, group in enumerate(groups):
            for blocks in group.req_to_blocks.values():
                for block in blocks:
                    if not block.is_null:
                        assert owner.setdefault(block.block_id, index) == index, f"{block} is in two groups' tables"
    free_ids = [block.block_id for block in pool.free_block_queue]
    assert len(free_ids) == len(set(free_ids)) == pool.free_block_queue.num_free_blocks
    if pool.eviction_policy is not None:
        # A policy orders every free block that holds a hash (engine/core/eviction_policies.py), after the empty ones.
        policy = pool.eviction_policy
        in_policy = [block.block_id for block in policy]
        assert len(in_policy) == len(set(in_policy)) == len(policy)
        assert free_ids[len(free_ids) - len(in_policy):] == in_policy
        for block in pool.free_block_queue:
            assert block.block_hash is None or policy.contains(block), f"{block} is free with a hash, outside the policy"
    free_set = set(free_ids)
    assert pool.null_block.block_id not in free_set and pool.null_block.block_id not in holders
    for block in pool.blocks:
        if block.is_null:
            continue
        assert block.ref_cnt == holders.get(block.block_id, 0), f"{block} held by {holders.get(block.block_id, 0)}"
        assert (block.ref_cnt == 0) == (block.block_id in free_set), f"{block} free-queue membership is wrong"
    assert len(free_set) + len(holders) == pool.num_blocks - 1
    shared_refs = sum(count - 1 for count in holders.values() if count > 1)
    assert pool.num_shared_refs == shared_refs, f"num_shared_refs {pool.num_shared_refs}, block tables say {shared_refs}"
    for group in groups:
        _check_block_runs(group)
    assert manager.num_block_runs == sum(group.num_block_runs for group in groups)
    # The index holds exactly the blocks with a hash, each under its own hash, none twice.
    cached_ids = pool.cached_block_hash_to_block.block_ids()
    for block_hash, block_ids in cached_ids.items():
        assert block_ids and all(pool.blocks[block_id].block_hash == block_hash for block_id in block_ids)
    hashed = sorted(block.block_id for block in pool.blocks if block.block_hash is not None)
    assert sorted(block_id for block_ids in cached_ids.values() for block_id in block_ids) == hashed
    for block_hash in cached_ids:  # a lookup finds the oldest copy
        assert pool.get_cached_block(block_hash).block_id == cached_ids[block_hash][0]


def _count_holders(manager: KVCacheManager, pool, holders: Counter) -> None:
    """Add each block of ``manager``'s tables to ``holders``, checking each table's shape on the way."""
    for request_id, blocks in manager.req_to_blocks.items():
        # A sliding window's skipped entries: the null block, a leading run of the table, no reference.
        num_skipped = manager.num_skipped_block.get(request_id, 0)
        assert all(block.is_null for block in blocks[:num_skipped]), f"{request_id}: skipped entries are not null"
        ids = [block.block_id for block in blocks[num_skipped:]]
        assert pool.null_block.block_id not in ids, f"{request_id} holds the null block past its skipped entries"
        assert len(ids) == len(set(ids)), f"{request_id} holds a block twice: {ids}"
        holders.update(ids)


def _check_block_runs(manager: KVCacheManager) -> None:
    """Runs of consecutive block ids, per request and in total, as the block tables say."""
    real_blocks = {request_id: [block for block in blocks if not block.is_null]
                   for request_id, blocks in manager.req_to_blocks.items()}
    runs_of = {request_id: sum(1 for position, block in enumerate(blocks)
                               if position == 0 or block.block_id != blocks[position - 1].block_id + 1)
               for request_id, blocks in real_blocks.items()}
    assert manager.num_block_runs_of == runs_of, f"num_block_runs_of {manager.num_block_runs_of}, tables say {runs_of}"
    assert manager.num_block_runs == sum(runs_of.values())


def check_scheduler_invariants(scheduler: Scheduler) -> None:
    manager = scheduler.kv_cache_manager
    check_kv_invariants(manager)
    running_ids = [request.request_id for request in scheduler.running]
    waiting_ids = [request.request_id for request in scheduler.waiting]
    assert len(running_ids) <= scheduler.max_num_seqs
    running_loras = {request.lora_request.lora_int_id for request in scheduler.running if request.lora_request}
    assert len(running_loras) <= scheduler.max_loras, f"running requests use adapters {sorted(running_loras)}"
    assert not set(running_ids) & set(waiting_ids)
    assert sorted(running_ids + waiting_ids) == sorted(scheduler.requests)
    # With LoRA on, the queue's count of its requests per adapter (admission skips its scan by it) is exact.
    if scheduler.max_loras:
        adapters = Counter(request.lora_request.lora_int_id if request.lora_request else None
                           for request in scheduler.waiting)
        assert scheduler.waiting._adapter_counts == dict(adapters), (scheduler.waiting._adapter_counts, adapters)
    for request in scheduler.running:
        assert request.status == RequestStatus.RUNNING
        held = len(manager.req_to_blocks[request.request_id]) * manager.block_size
        assert held >= request.num_computed_tokens, f"{request} holds only {held} slots"
        # A draft model's lookahead: slots for its writes past what the request has computed (config.py).
        lookahead = scheduler.scheduler_config.num_lookahead_tokens
        assert held >= min(request.num_computed_tokens + lookahead, scheduler.max_model_len), \
            f"{request} holds {held} slots, short of its lookahead of {lookahead}"
        if request.spec_token_ids:
            # Drafts follow a decode's last token, within what it may still produce (engine/core/spec_decode.py).
            assert len(request.spec_token_ids) <= scheduler.num_speculative_tokens
            assert len(request.output_token_ids) + len(request.spec_token_ids) < request.max_tokens
            assert request.num_tokens + len(request.spec_token_ids) <= scheduler.max_model_len
    for request in scheduler.waiting:
        assert not request.spec_token_ids, f"{request} waits with drafts"
    transfers = scheduler.kv_transfers
    for request in scheduler.waiting:
        request_id = request.request_id
        assert request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED, RequestStatus.WAITING_FOR_REMOTE_KVS)
        if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
            # Loading from a prefill engine: blocks for its whole prompt; only the local prefix hit computed.
            assert request_id in transfers.loading and not request.do_remote_prefill
            assert len(manager.req_to_blocks[request_id]) * manager.block_size >= request.num_tokens
            assert manager.num_cached_block[request_id] * manager.block_size <= request.num_computed_tokens
        else:
            # A loaded request is scheduled in the schedule() that finds it loaded: none waits with blocks.
            assert request.num_computed_tokens == 0 and request_id not in manager.req_to_blocks
    assert set(transfers.loading) <= {request.request_id for request in scheduler.waiting}
    assert transfers.loaded <= set(transfers.loading)
    for request_id, request in transfers.sending.items():
        # Finished, gone from the scheduler, its blocks held until the decode engine has read them.
        assert request.is_finished and request_id not in scheduler.requests
        assert request_id in manager.req_to_blocks
    # Blocks are held by live requests (and finished ones whose KV is being sent) only.
    assert set(manager.req_to_blocks) <= set(scheduler.requests) | set(transfers.sending)
    check_encoder_cache_invariants(scheduler)


def check_encoder_cache_invariants(scheduler: Scheduler) -> None:
    """engine/core/encoder_cache_manager.py's invariants, between steps."""
    encoder = scheduler.encoder_cache_manager
    assert not encoder.pending, f"entries pending between steps: {encoder.pending}"
    assert encoder.num_free_slots == encoder.cache_size - sum(encoder.sizes.values()) >= 0
    assert encoder.num_reclaimable_slots == encoder.num_free_slots + sum(encoder.freeable.values())
    assert set(encoder.freeable) == set(encoder.sizes) - set(encoder.holders)
    assert all(encoder.freeable[identifier] == encoder.sizes[identifier] for identifier in encoder.freeable)
    assert all(holders for holders in encoder.holders.values())
    # Each running request holds exactly the items its prefill is inside (its next chunk reads them); nobody else.
    expected = {request.request_id: {feature.identifier for feature in request.mm_features
                                     if feature.offset < request.num_computed_tokens < feature.end}
                for request in scheduler.running}
    expected = {request_id: held for request_id, held in expected.items() if held}
    assert encoder.held_by_request == expected, f"held {encoder.held_by_request}, prefills inside {expected}"
    by_identifier: dict[str, set[str]] = {}
    for request_id, held in expected.items():
        for identifier in held:
            by_identifier.setdefault(identifier, set()).add(request_id)
    assert encoder.holders == by_identifier


def check_cached_blocks_were_computed(scheduler: Scheduler, executor: ScriptedExecutor) -> None:
    """A prefix-cache hit must only ever find KV that an executor really computed."""
    full = set(range(scheduler.block_size))
    for block in scheduler.kv_cache_manager.block_pool.cached_block_hash_to_block.blocks():
        assert executor.computed_slots.get(block.block_id) == full, \
            f"{block} is in the prefix cache but its KV was never computed"


def expected_tokens(executor: ScriptedExecutor, request_id: str, prompt, num_tokens: int,
                    eos_token_id: int | None = None) -> list[int]:
    """The tokens the scripted executor produces for a request run alone, without preemption."""
    import zlib
    from engine.core.scripted_executor import _RequestState
    state = _RequestState(list(prompt), 0, [], eos_token_id, zlib.crc32(request_id.encode()))
    produced = []
    for _ in range(num_tokens):
        token = executor.next_token(state)
        state.token_ids.append(token)
        produced.append(token)
    return produced


def run_to_completion(core: EngineCore, max_steps: int = 100_000) -> dict:
    """Step until idle; return the outputs per request id (tokens, finish reason)."""
    results: dict[str, dict] = {}
    for _ in range(max_steps):
        if not core.has_work():
            return results
        step = core.step()
        for output in step.outputs:
            entry = results.setdefault(output.request_id, {"tokens": [], "finish_reason": None})
            entry["tokens"].extend(output.new_token_ids)
            if output.finish_reason:
                entry["finish_reason"] = output.finish_reason
    raise AssertionError("the engine did not finish")
