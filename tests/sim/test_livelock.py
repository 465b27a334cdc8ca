"""A configuration whose requests evict each other for ever stops with an error that says what to change."""

from __future__ import annotations

import pytest

from sim.livelock import MAX_PREEMPTIONS_PER_REQUEST, EngineLivelockError
from sim.run_pipeline import run_simulation
from tests.sim.test_cluster import chat

# Two completions of one prompt (same priority, same arrival) that the pool cannot hold together: under the
# priority policy the victim is the one admitted first, the one furthest ahead, so they take turns.
LIVELOCK = ["model=qwen2-0.5b", "hardware=l40s", "engine.num_gpu_blocks=80", "engine.max_model_len=1024",
            "engine.scheduling_policy=priority", "workload.n=2", "workload.num_requests=2",
            "engine.max_num_batched_tokens=512", "engine.long_prefill_token_threshold=64", "engine.max_num_seqs=4",
            "engine.enable_prefix_caching=false"]


@pytest.mark.parametrize("extra", [[], ["engine.async_scheduling=true"]])
def test_requests_that_evict_each_other_for_ever_stop_the_run_with_an_error_naming_the_policy(extra):
    with pytest.raises(EngineLivelockError, match=rf"preempted {MAX_PREEMPTIONS_PER_REQUEST} times without "
                                                  r"finishing: the engine is livelocked \(engine.scheduling_policy "
                                                  r"'priority'"):
        run_simulation(chat(*LIVELOCK, *extra), None)


def test_the_same_requests_finish_when_the_newest_is_evicted(capsys):
    from sim.run import main as sim_run_main

    summary = run_simulation(chat(*LIVELOCK, "engine.scheduling_policy=fcfs"), None).summary
    assert summary["num_finished"] == 4 and 0 < summary["num_preemptions"] < 4 * MAX_PREEMPTIONS_PER_REQUEST
    arguments = [item for override in LIVELOCK for item in ("--set", override)]
    assert sim_run_main(["chat", *arguments, "--no-progress", "--no-dashboard"]) == 2
    assert "the engine is livelocked" in capsys.readouterr().err
