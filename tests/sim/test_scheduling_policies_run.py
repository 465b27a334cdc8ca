"""Scheduling policies in the simulator: the shipped example's sweep (fcfs, shortest prompt first, shortest
output first on an overloaded engine) shows what each policy is known to do, and a user's own rank function,
named in the YAML, runs the same way."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis import read_run
from analysis.metrics import request_latencies
from sim.engine_setup import SetupError, build_setup
from sim.run import main as sim_run_main
from sim.run_pipeline import run_simulation
from workloads import example_path, load_workload

POLICIES = ("fcfs", "shortest_prompt_first", "shortest_output_first")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each point's requests, with their latencies, by policy."""
    out = tmp_path_factory.mktemp("policies") / "scheduling_policies"
    assert sim_run_main(["scheduling_policies", "--out", str(out), "--no-progress", "--no-dashboard"]) == 0
    table = pd.read_csv(out / "sweep.csv").set_index("point")
    return {policy: with_latencies(read_run(table.loc[f"scheduling_policy={policy}", "run_dir"]).requests)
            for policy in POLICIES}


def with_latencies(requests: pd.DataFrame) -> pd.DataFrame:
    return requests.merge(request_latencies(requests), on="request_id")


def test_each_policy_does_what_it_is_known_for(runs):
    fcfs, by_prompt, by_output = (runs[policy] for policy in POLICIES)
    # The same requests at every point: only the order differs.
    assert fcfs["request_id"].tolist() == by_prompt["request_id"].tolist() == by_output["request_id"].tolist()
    assert (fcfs["num_output_tokens"] == by_output["num_output_tokens"]).all()
    # Shortest job first minimizes mean completion time: the mean request finishes far sooner...
    assert by_output["e2e_ms"].mean() < 0.7 * fcfs["e2e_ms"].mean()
    # ...and a short prompt first gets its first token sooner, the typical request too.
    assert by_prompt["ttft_ms"].median() < 0.7 * fcfs["ttft_ms"].median()
    # What both pay: the longest jobs starve behind the short ones (the tail is longer than fcfs's).
    assert by_output["e2e_ms"].quantile(0.99) > fcfs["e2e_ms"].quantile(0.99)


def test_short_outputs_wait_less_than_long_ones_under_shortest_output_first(runs):
    for policy, ratio in (("shortest_output_first", 0.5), ("fcfs", None)):
        requests = runs[policy]
        short = requests[requests["num_output_tokens"] <= requests["num_output_tokens"].quantile(0.25)]
        long = requests[requests["num_output_tokens"] >= requests["num_output_tokens"].quantile(0.75)]
        if ratio is not None:
            assert short["ttft_ms"].mean() < ratio * long["ttft_ms"].mean()
        else:  # fcfs does not look at lengths: both quarters wait about as long
            assert short["ttft_ms"].mean() == pytest.approx(long["ttft_ms"].mean(), rel=0.5)


def test_a_users_rank_function_named_in_the_yaml_orders_the_queue(tmp_path):
    def long_prompts_ttft(policy: str) -> float:
        workload = load_workload(example_path("scheduling_policies"),
                                 overrides=[f"engine.scheduling_policy={policy}", "workload.duration_s=10"])
        run_simulation(workload, tmp_path / policy.replace(":", "_"))
        requests = with_latencies(read_run(tmp_path / policy.replace(":", "_")).requests)
        return requests[requests["num_prompt_tokens"] >= requests["num_prompt_tokens"].quantile(0.75)]["ttft_ms"].mean()

    # The opposite orders: long prompts wait less under the user's rank than under shortest_prompt_first.
    assert long_prompts_ttft("tests.core.rank_functions:longest_prompt_first") < \
        0.5 * long_prompts_ttft("shortest_prompt_first")


def test_a_rank_function_that_does_not_import_is_an_error_naming_the_field():
    workload = load_workload(example_path("scheduling_policies"),
                             overrides=["engine.scheduling_policy=no_such_policies:rank"])
    with pytest.raises(SetupError, match=r"^engine\.scheduling_policy must be 'module:function' whose module "
                                         r"imports \(No module named 'no_such_policies'\), got 'no_such_policies:rank'"):
        build_setup(workload)


@pytest.mark.parametrize("policy", ["shortest_output_first", "tests.core.rank_functions:longest_prompt_first"])
def test_decode_fast_forward_changes_nothing_under_a_ranked_policy(tmp_path, policy):
    overrides = [f"engine.scheduling_policy={policy}", "workload.duration_s=8", "engine.num_gpu_blocks=300"]
    workload = load_workload(example_path("scheduling_policies"), overrides=overrides)
    run_simulation(workload, tmp_path / "on")
    run_simulation(workload, tmp_path / "off", fast_forward=False)
    on, off = (read_run(tmp_path / name) for name in ("on", "off"))
    assert on.summary["num_preemptions"] > 0  # a pool this short preempts by the policy's rank
    pd.testing.assert_frame_equal(on.requests, off.requests)
    pd.testing.assert_frame_equal(on.steps, off.steps)
