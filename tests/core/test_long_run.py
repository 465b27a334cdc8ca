"""Thousands of requests through the scripted executor on a pool small enough to preempt."""

from __future__ import annotations

import random

from tests.core.helpers import check_cached_blocks_were_computed, check_scheduler_invariants, make_core, make_request


def test_thousands_of_requests_end_finished_or_aborted_with_every_block_free():
    rng = random.Random(1234)
    core = make_core(num_gpu_blocks=120, block_size=16, max_num_seqs=32, max_num_batched_tokens=512,
                     max_model_len=1024, long_prefill_token_threshold=256, eos_probability=0.02, seed=7)
    shared_prefixes = [[rng.randrange(32000) for _ in range(rng.choice([16, 48, 100]))] for _ in range(8)]
    num_requests = 3000
    submitted, finished = set(), {}
    next_id = 0
    steps = 0
    while next_id < num_requests or core.has_work():
        for _ in range(rng.choice([0, 0, 1, 2, 3])):
            if next_id >= num_requests:
                break
            prefix = rng.choice(shared_prefixes) if rng.random() < 0.5 else []
            prompt = prefix + [rng.randrange(32000) for _ in range(rng.randint(0, 300))]
            request_id = f"req-{next_id}"
            core.add_request(make_request(request_id, prompt, max_tokens=rng.randint(1, 64), eos_token_id=2,
                                          arrival_time=steps * 0.01))
            submitted.add(request_id)
            next_id += 1
        if rng.random() < 0.02 and core.scheduler.requests:
            core.abort_requests(rng.choice(sorted(core.scheduler.requests)))
        result = core.step()
        steps += 1
        for output in result.outputs:
            if output.finish_reason:
                finished[output.request_id] = output.finish_reason
        if steps % 500 == 0:
            check_scheduler_invariants(core.scheduler)
            check_cached_blocks_were_computed(core.scheduler, core.executor)
    assert set(finished) == submitted
    assert set(finished.values()) <= {"stop", "length", "abort", "ignored"}
    assert {"stop", "length", "abort"} <= set(finished.values())
    assert core.scheduler.num_preemptions_total > 0, "the pool was meant to force preemption"
    manager = core.scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks
    assert not manager.req_to_blocks
    check_scheduler_invariants(core.scheduler)
