"""engine.prefix_cache_eviction_policy in the simulator: LFU keeps the popular system prompts a stream of one-off
documents flushes under LRU (the prefix_cache_eviction example, shortened), and bad names are refused by field."""

from __future__ import annotations

import pytest

from sim.engine_setup import SetupError, build_setup
from sim.run_pipeline import run_simulation
from workloads import WorkloadError, example_path, load_workload

SHORT = ["sweep=null", "workload.duration_s=100", "workload.classes[0].duration_s=100", "engine.num_gpu_blocks=3000"]


def test_lfu_keeps_more_of_the_popular_prefixes_than_lru(tmp_path):
    summaries = {}
    for policy in ("lru", "lfu"):
        workload = load_workload(example_path("prefix_cache_eviction"),
                                 overrides=[*SHORT, f"engine.prefix_cache_eviction_policy={policy}"])
        summaries[policy] = run_simulation(workload, tmp_path / policy).summary
        assert summaries[policy]["num_finished"] == summaries[policy]["num_requests"]
        assert summaries[policy]["config"]["cache"]["eviction_policy"] == policy
    assert summaries["lfu"]["prefix_cache_hit_rate"] > summaries["lru"]["prefix_cache_hit_rate"] + 0.02


def test_bad_policies_name_the_field():
    with pytest.raises(WorkloadError, match="engine.prefix_cache_eviction_policy: must be lru, lfu, or 'module:Class'"):
        load_workload(example_path("prefix_cache_eviction"), overrides=["engine.prefix_cache_eviction_policy=mru"])
    workload = load_workload(example_path("prefix_cache_eviction"),
                             overrides=[*SHORT, "engine.prefix_cache_eviction_policy=tests.core.nothing_here:Policy"])
    with pytest.raises(SetupError, match="engine.prefix_cache_eviction_policy must be 'module:Class' whose module "
                                         "imports"):
        build_setup(workload)
