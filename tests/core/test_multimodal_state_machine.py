"""The scheduler state machine (tests/core/test_scheduler_state_machine.py) with every request showing images.

The general machine draws images for a share of its requests among many other features; this one draws them for
every request, from a pool where two images encode to the same number of placeholder tokens (so only the block
hashes' image keys keep their KV apart), behind the same text, with prefix caching on in most runs and encoder
budgets and caches from one image's size to several. Everything the general machine checks holds here too:
each chunk finds the encoder output of every image it computes, nothing is encoded twice while kept, the
executor's encoder cache equals the scheduler's ledger, a prefix hit finds KV computed with the request's own
images, no block or encoder slot leaks, and every request produces its own tokens.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, rule

from tests.core.test_scheduler_state_machine import IMAGES, PREFIXES, SchedulerMachine


class MultimodalSchedulerMachine(SchedulerMachine):
    @initialize(
        num_gpu_blocks=st.integers(6, 64), block_size=st.sampled_from([2, 4, 8]),
        max_num_seqs=st.integers(1, 6), max_num_batched_tokens=st.integers(6, 96),
        max_model_len=st.integers(40, 300), chunked=st.sampled_from([True, True, True, False]),
        threshold=st.sampled_from([0, 0, 7, 33]),
        policy=st.sampled_from(["fcfs", "priority", "shortest_prompt_first"]),
        caching=st.sampled_from([True, True, True, False]),
        max_in_flight=st.sampled_from([1, 1, 2]), async_scheduling=st.booleans(),
        eos_probability=st.just(0.0), offload_blocks=st.just(0),
        speculative_tokens=st.sampled_from([0, 0, 2]), draft_acceptance=st.just(0.5),
        max_loras=st.just(0), sliding_window=st.just(None),
        kv_cache_groups=st.sampled_from([None, None, None, (None, 5)]),
        encoder_budget=st.sampled_from([None, 5, 6, 11, 30, 40]),
        encoder_cache=st.sampled_from([None, 30, 31, 36, 70]),
        disable_chunked_mm_input=st.sampled_from([False, False, True]),
        eviction_policy=st.sampled_from(["lru", "lfu"]))
    def setup(self, **config):
        super().setup(**config)

    @rule(prefix=st.sampled_from(PREFIXES), suffix_len=st.integers(0, 24), max_tokens=st.integers(1, 8),
          priority=st.integers(0, 3),
          images=st.lists(st.tuples(st.sampled_from(sorted(IMAGES)), st.sampled_from([0, 0, 3, 9])),
                          min_size=1, max_size=3))
    def add_request(self, prefix, suffix_len, max_tokens, priority, images):
        super().add_request(prefix, suffix_len, max_tokens, priority, "none", 0, images)


MultimodalSchedulerMachine.TestCase.settings = settings(max_examples=250, stateful_step_count=50, deadline=None)
TestMultimodalSchedulerStateMachine = MultimodalSchedulerMachine.TestCase
