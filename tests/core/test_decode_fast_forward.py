"""Fast-forwarded decode steps leave exactly the state that ordinary steps leave.

Random pools, block sizes, prefix sharing, sliding windows and length caps; the same scheduler state is
advanced k steps by ``schedule()`` + ``update_from_output()`` on one copy and by ``DecodeFastForward`` on
the other, and everything the core holds is compared: tokens, statuses, block tables (a window's null
entries too), reference counts, the free queue's order, the prefix-cache map, KV events, and the per-step
batch figures.
"""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core import ModelRunnerOutput
from engine.core.decode_fast_forward import DecodeFastForward

from tests.core.helpers import check_scheduler_invariants, make_core, make_request

TOKEN = 11


def constant_output(scheduler_output):
    return ModelRunnerOutput([], dict.fromkeys(scheduler_output.num_scheduled_tokens, 0), [[TOKEN]])


def snapshot(scheduler):
    manager = scheduler.kv_cache_manager
    pool = manager.block_pool
    # A hybrid KV cache's groups, each with its tables, counts and runs (engine/core/hybrid_kv_cache_manager.py).
    groups = getattr(manager, "groups", None) or [manager]
    return {
        "groups": [{"tables": {rid: [b.block_id for b in blocks] for rid, blocks in group.req_to_blocks.items()},
                    "cached_counts": dict(group.num_cached_block), "skipped_counts": dict(group.num_skipped_block),
                    "runs": (dict(group.num_block_runs_of), group.num_block_runs)} for group in groups],
        "running": [(r.request_id, r.status, r.num_computed_tokens, r.num_tokens, tuple(r.output_token_ids),
                     tuple(r.block_hashes)) for r in scheduler.running],
        "requests": sorted(scheduler.requests),
        "free_order": [b.block_id for b in pool.free_block_queue],
        "hash_map": pool.cached_block_hash_to_block.block_ids(),
        "ref_counts": [b.ref_cnt for b in pool.blocks],
        "finished": sorted(scheduler.finished_req_ids),
        "events": pool.take_events(),
        "host_tier": manager.offload.hashes() if manager.offload is not None else None,
        "host_slots": [manager.offload.slot(block_hash) for block_hash in manager.offload.hashes()]
        if manager.offload is not None else None,
        "offloaded_counts": dict(getattr(manager, "num_offloaded_block", {})),
        "runs": manager.num_block_runs,
        "shared_refs": pool.num_shared_refs,
    }


@settings(max_examples=400, deadline=None)
@given(num_blocks=st.integers(12, 80), block_size=st.sampled_from([1, 2, 4, 16]), caching=st.booleans(),
       prompts=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 40), st.integers(1, 60)), min_size=1,
                        max_size=8),
       num_steps=st.integers(1, 80), warmup=st.integers(0, 5), identical=st.booleans(),
       offload_blocks=st.sampled_from([0, 3, 40]),
       # Windows below a block, of one block (block_size 16), of several, past every sequence; or none.
       window=st.one_of(st.none(), st.sampled_from([1, 2, 5, 16, 17, 33]), st.integers(1, 120)),
       # A hybrid KV cache (its groups' windows; a window or a host tier is then not drawn with it).
       groups=st.sampled_from([None] * 4 + [(None, 5), (7, None, 7), (None, 16, 33), (1, None)]),
       # Eviction by LFU: the run allocates from the empty blocks only, ahead of the policy's (policy_free_queue.py).
       eviction_policy=st.sampled_from(["lru", "lru", "lfu"]))
def test_fast_forward_equals_ordinary_steps(num_blocks, block_size, caching, prompts, num_steps, warmup, identical,
                                            offload_blocks, window, groups, eviction_policy):
    if groups is not None:
        window, offload_blocks = None, 0
    core = make_core(num_gpu_blocks=num_blocks, block_size=block_size, enable_prefix_caching=caching,
                     enable_kv_cache_events=True, max_model_len=400,
                     num_offload_blocks=offload_blocks if caching and window is None else 0, sliding_window=window,
                     kv_cache_groups=groups, eviction_policy=eviction_policy)
    scheduler = core.scheduler
    shared = [list(range(100, 120)), list(range(200, 207)), [], list(range(300, 348))]
    for index, (group, suffix, max_tokens) in enumerate(prompts):
        # identical: prompts of one group and length repeat, so blocks of equal content (not shared: the
        # cache keeps one of them) fill at the same time, and freed ones go back to the queue unhashed.
        prompt = shared[group] + [((0 if identical else index) * 31 + i) % 97 for i in range(suffix)]
        scheduler.add_request(make_request(f"r{index}", prompt, max_tokens=max_tokens))
    plan = reach_a_plan(scheduler, warmup)
    if plan is not None:
        check_fast_forward(scheduler, plan, num_steps, window)


@pytest.mark.parametrize("caching", [True, False])
def test_windows_that_start_at_different_blocks_of_a_shared_prefix(caching):
    """Requests on one long prompt prefix whose windows start at different blocks of it: the shortest holds
    prefix blocks the others have handed back, followed in its table by blocks they still hold, and it
    finishes in the run (so its shared blocks do not lead its table); without prefix caching, nothing is
    shared and every block handed back goes to the free queue's front."""
    core = make_core(num_gpu_blocks=60, block_size=8, enable_prefix_caching=caching, enable_kv_cache_events=True,
                     max_model_len=400, sliding_window=16)
    scheduler = core.scheduler
    prefix = list(range(100, 164))  # 8 blocks
    # Windows from block 6, 7 and 8: r0 holds block 6 alone and block 7 with r1, and finishes first.
    for index, (suffix, max_tokens) in enumerate([(1, 6), (9, 30), (17, 12)]):
        scheduler.add_request(make_request(f"r{index}", prefix + [index] * suffix, max_tokens=max_tokens))
    plan = reach_a_plan(scheduler, 0)
    assert plan is not None
    check_fast_forward(scheduler, plan, 60, 16)


def reach_a_plan(scheduler, warmup: int) -> DecodeFastForward | None:
    """Ordinary steps until the batch is decode-only (and ``warmup`` more), as a simulation would reach it."""
    for _ in range(200):
        if not scheduler.has_unfinished_requests():
            return None
        plan = DecodeFastForward.try_plan(scheduler, TOKEN)
        if plan is not None and warmup <= 0:
            return plan
        warmup -= plan is not None
        output = scheduler.schedule()
        scheduler.update_from_output(output, constant_output(output))
    return None


def check_fast_forward(scheduler, plan: DecodeFastForward, num_steps: int, window: int | None) -> None:
    """Fast-forward ``scheduler`` by ``num_steps`` and compare it with ordinary steps of a copy."""
    ordinary = copy.deepcopy(scheduler)
    snapshot(ordinary)  # drain events recorded so far in both copies
    snapshot(scheduler)

    planned = [plan.step(step) for step in range(num_steps)]
    result = plan.apply(num_steps)
    assert 0 <= result.num_steps <= num_steps
    if result.num_steps == 0:  # the pool could not hold even one step's blocks: nothing may change
        assert snapshot(scheduler) == snapshot(ordinary)
        return

    expected_steps = []
    # The host copies each schedule hands the executor; a fast-forward has no executor and keeps them pending.
    ordinary_stores = []
    for step in range(result.num_steps):
        output = ordinary.schedule()
        ordinary_stores.extend(output.offload_stores)
        assert not output.preempted_req_ids and not output.scheduled_new_reqs
        assert all(count == 1 for count in output.num_scheduled_tokens.values())
        cached = output.scheduled_cached_reqs
        expected_steps.append((len(cached.req_ids),
                               sum(c + 1 if window is None else min(c + 1, window) for c in cached.num_computed_tokens),
                               max(c + 1 for c in cached.num_computed_tokens), output.num_shared_kv_tokens,
                               output.num_kv_block_runs))
        ordinary.update_from_output(output, constant_output(output))
        assert result.num_free_blocks_after[step] == ordinary.kv_cache_manager.num_free_blocks
        assert result.num_running_after[step] == len(ordinary.running)
    assert [(s.num_decode_reqs, s.decode_context_tokens, s.max_seq_len, s.shared_kv_tokens, s.kv_block_runs)
            for s in planned[:result.num_steps]] == expected_steps
    mine, theirs = snapshot(scheduler), snapshot(ordinary)
    assert set(theirs.pop("finished")) <= set(mine.pop("finished"))
    assert mine == theirs
    ordinary_stores.extend(ordinary.kv_cache_manager.take_offload_stores())
    # Where each host slot's copy comes from, once every copy handed out is made.
    assert {slot: block_id for block_id, slot in scheduler.kv_cache_manager.take_offload_stores()} \
        == {slot: block_id for block_id, slot in ordinary_stores}
    check_scheduler_invariants(scheduler)


def test_no_plan_while_requests_wait_or_prefill():
    core = make_core(max_num_seqs=1)
    scheduler = core.scheduler
    scheduler.add_request(make_request("a", range(20), max_tokens=5))
    scheduler.add_request(make_request("b", range(20), max_tokens=5))
    assert DecodeFastForward.try_plan(scheduler, TOKEN) is None  # nothing running yet
    output = scheduler.schedule()
    scheduler.update_from_output(output, constant_output(output))
    assert DecodeFastForward.try_plan(scheduler, TOKEN) is None  # b waits


def test_no_plan_when_the_token_could_stop_a_request():
    core = make_core()
    scheduler = core.scheduler
    scheduler.add_request(make_request("a", range(20), max_tokens=5, stop_token_ids=[TOKEN]))
    output = scheduler.schedule()
    scheduler.update_from_output(output, ModelRunnerOutput([], {"a": 0}, [[3]]))
    assert DecodeFastForward.try_plan(scheduler, TOKEN) is None
    assert DecodeFastForward.try_plan(scheduler, TOKEN + 1) is not None
