"""Data-parallel ranks of a mixture of experts (engine.data_parallel_size, vLLM's --data-parallel-size with expert
parallelism): the experts spread over every rank's GPUs, each rank its own KV pool, the ranks stepping in lockstep
(sim/cost_models/expert_parallel.py, sim/data_parallel_loop.py)."""

from __future__ import annotations

from collections import defaultdict

import pandas as pd
import pytest

from sim.cost_models import AnalyticalCostModel, StepBatch
from sim.engine_setup import SetupError, build_setup
from sim.hardware import resolve_hardware
from sim.kv_cache_capacity import kv_cache_num_blocks
from sim.model_presets import resolve_model
from sim.run import main as sim_run_main
from sim.run_pipeline import simulate
from workloads import example_path, load_workload

DP8 = ["sweep=null", "engine.tensor_parallel_size=1", "engine.data_parallel_size=8"]


def example(*overrides):
    return load_workload(example_path("deepseek_data_parallel"),
                         overrides=["sweep=null", "workload.num_requests=80", *overrides])


def test_each_gpu_holds_an_eighth_of_the_experts_and_its_rank_its_own_pool():
    model, h200 = resolve_model("deepseek-v3"), resolve_hardware("h200")
    # One GPU alone cannot hold 671B parameters; as one of eight ranks it holds the attention, dense layers, shared
    # experts and embeddings whole, and 32 of each layer's 256 routed experts.
    with pytest.raises(ValueError, match="no room"):
        kv_cache_num_blocks(model, h200, "bfloat16", 16, 0.9, quantization="fp8")
    rank = kv_cache_num_blocks(model, h200, "bfloat16", 16, 0.9, quantization="fp8", data_parallel_size=8)
    expert_bytes = 58 * 256 * model.expert_parameters  # fp8: a byte a weight
    weights = model.weight_bytes("bfloat16", "fp8") - expert_bytes * 7 / 8
    budget = h200.memory_bytes * 0.9 - weights - h200.memory_bytes * 0.03
    assert rank == int(budget // (16 * model.kv_bytes_per_token("bfloat16")))
    # With the MTP module as a draft: its weights (its experts spread the same way) and its layer's cache too.
    from sim.mtp_draft import mtp_draft_shape

    draft = mtp_draft_shape(model)
    with_mtp = kv_cache_num_blocks(model, h200, "bfloat16", 16, 0.9, quantization="fp8", data_parallel_size=8,
                                   draft_model=draft, draft_quantization="fp8")
    draft_weights = draft.weight_bytes("bfloat16", "fp8") - 256 * draft.expert_parameters * 7 / 8
    assert with_mtp == int((budget - draft_weights) // (16 * 62 * 576 * 2))
    # Eight ranks' pools hold about five times the tokens of one tensor-parallel engine's (the latent is copied
    # to each of its eight GPUs).
    tensor_parallel = kv_cache_num_blocks(model, h200, "bfloat16", 16, 0.9, quantization="fp8",
                                          tensor_parallel_size=8)
    assert 4 < 8 * rank / tensor_parallel < 6


def test_a_ranks_step_leaves_the_routed_experts_to_the_lockstep_step():
    model, h200 = resolve_model("deepseek-v3"), resolve_hardware("h200")
    alone = AnalyticalCostModel(model, h200, "bfloat16", quantization="fp8")
    rank = AnalyticalCostModel(model, h200, "bfloat16", quantization="fp8", data_parallel_size=8)
    batch = StepBatch([1] * 32, [2000] * 32)
    experts = alone.routed_experts.scaled(58)
    assert rank.step_time(batch) == pytest.approx(alone.step_time(batch) - experts.time(32), rel=1e-9)
    moe = rank.expert_parallel
    # The routed experts of all ranks' 256 tokens: an eighth of the rows and of the touched experts' weights.
    assert moe.experts.time(256) == pytest.approx(experts.time(256) / 8, rel=1e-12)
    # Two all-to-alls per MoE layer, each of the busiest rank's tokens' 8 rows, 7/8 of them to other GPUs.
    latency, per_byte = h200.send_coefficients()
    assert moe.time(256, 40) == pytest.approx(experts.time(256) / 8 + 2 * 58 * latency
                                              + 40 * 2 * 58 * 8 * 7168 * 2 * 7 / 8 * per_byte, rel=1e-12)
    assert moe.time(0, 0) == 0.0
    description = rank.describe()
    assert description["expert_parallel"]["data_parallel_size"] == 8
    # Each GPU holds 32 of a layer's 256 routed experts, and one token reads 8 of them across the 8 GPUs.
    expert_bytes = 58 * 256 * model.expert_parameters
    assert description["weight_bytes_per_gpu"] == pytest.approx(
        model.weight_bytes("bfloat16", "fp8") - expert_bytes * 7 / 8, rel=1e-12)
    one_token = model.weight_bytes("bfloat16", "fp8") - expert_bytes + 58 * 8 * model.expert_parameters / 8
    assert description["weight_read_s_one_token"] == pytest.approx(one_token / h200.achievable_bandwidth, rel=1e-12)


MTP = "engine.speculative_decoding={method: mtp, num_speculative_tokens: 2, acceptance_rate: [0.85, 0.7]}"


@pytest.mark.parametrize("speculation", [None, MTP])
def test_the_ranks_step_in_lockstep_for_the_slowest_rank_plus_the_experts(monkeypatch, speculation):
    """Each lockstep step lasts its slowest rank's own time (its executor's: its batch without the routed experts,
    and with MTP its drafts' passes without theirs) plus the routed experts and all-to-alls of every rank's tokens
    (with MTP also the module's, in its first pass and, for each later draft, over the ranks' sampling requests)."""
    setup = build_setup(example(*DP8[1:], "workload.arrival.rate=4", *([speculation] if speculation else [])))
    moe = setup.cost_model.expert_parallel
    draft = setup.speculation.draft_cost_model.expert_parallel if speculation else None
    ranks_by_start: dict[float, list[tuple[float, int, int]]] = defaultdict(list)

    def watch(simulation):  # each rank's own step time (its executor's) at each step start
        for replica in simulation.replicas:
            executor = replica.executor
            original = executor.execute_model

            def execute(output, executor=executor, original=original, env=simulation.env):
                result = original(output)
                if output.total_num_scheduled_tokens:
                    ranks_by_start[env.now].append((executor.last_duration, output.total_num_scheduled_tokens,
                                                    getattr(executor, "last_num_sampling", 0)))
                return result
            executor.execute_model = execute

    from sim.simulator import Simulation
    init = Simulation.__init__

    def watched_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        watch(self)

    monkeypatch.setattr(Simulation, "__init__", watched_init)
    traces = simulate(setup)
    steps = pd.DataFrame(traces.step_columns())
    assert set(steps.replica) == set(range(8))
    checked, waited, rank_s, experts_s, step_s = 0, 0.0, 0.0, 0.0, 0.0
    for start, rows in steps.groupby("start_time"):
        ranks = ranks_by_start[start]
        assert len(rows) == len(ranks) and rows.duration.nunique() == 1
        tokens = [count for _, count, _ in ranks]
        slowest = max(duration for duration, _, _ in ranks)
        experts = moe.time(sum(tokens), max(tokens))
        if draft is not None:
            sampling = [count for _, _, count in ranks]
            experts += draft.time(sum(tokens), max(tokens)) + draft.time(sum(sampling), max(sampling))
        assert rows.duration.iloc[0] == pytest.approx(slowest + experts, rel=1e-12)
        checked += 1
        waited += 8 * slowest - sum(duration for duration, _, _ in ranks)
        rank_s, experts_s, step_s = rank_s + 8 * slowest, experts_s + experts, step_s + slowest + experts
    assert checked > 100
    # The summary's account of the lockstep: the ranks' time waiting for the slowest, the experts' share.
    lockstep = traces.lockstep.summary(1)
    assert lockstep["lockstep_steps"] == checked
    assert lockstep["rank_wait_share"] == pytest.approx(waited / rank_s, rel=1e-9)
    assert lockstep["routed_experts_share"] == pytest.approx(experts_s / step_s, rel=1e-9)
    assert 0 < lockstep["rank_wait_share"] < 1
    # One step at a time: the next starts when this one ends.
    starts = steps.groupby("start_time").duration.first().sort_index()
    assert (starts.index[1:] >= (starts.index[:-1] + starts.values[:-1]) - 1e-9).all()


def test_mtp_drafts_speed_up_the_data_parallel_ranks(tmp_path):
    import json

    tpot = {}
    for name, overrides in (("off", []), ("mtp", [MTP])):
        out = tmp_path / name
        arguments = ["deepseek_data_parallel", "--set", "sweep=null", "--set", "workload.num_requests=80"]
        for override in [*DP8[1:], *overrides]:
            arguments += ["--set", override]
        assert sim_run_main([*arguments, "--out", str(out), "--no-progress", "--no-dashboard", "--quiet"]) == 0
        tpot[name] = json.loads((out / "summary.json").read_text())["tpot_ms"]["p50"]
    assert tpot["mtp"] < 0.8 * tpot["off"]


def test_the_example_runs_and_eight_ranks_hold_the_slo_where_one_engine_preempts(tmp_path):
    """The example's two layouts at its busier rate (8 req/s; the sweep's points, run one at a time)."""
    import json

    summaries = {}
    for layout, overrides in (("tensor_parallel", []), ("data_parallel", DP8[1:])):
        out = tmp_path / layout
        arguments = ["deepseek_data_parallel", "--set", "sweep=null", "--set", "workload.arrival.rate=8"]
        for override in overrides:
            arguments += ["--set", override]
        assert sim_run_main([*arguments, "--out", str(out), "--no-progress", "--no-dashboard", "--quiet"]) == 0
        summaries[layout] = json.loads((out / "summary.json").read_text())
    tensor_parallel, data_parallel = summaries["tensor_parallel"], summaries["data_parallel"]
    assert tensor_parallel["num_preemptions"] > 0 and data_parallel["num_preemptions"] == 0
    assert data_parallel["slo_attainment"] > tensor_parallel["slo_attainment"]
    assert data_parallel["output_token_throughput"] > tensor_parallel["output_token_throughput"]


def test_replicas_of_data_parallel_engines_step_each_in_its_own_lockstep():
    """Two engines of eight ranks (16 GPUs): 16 replicas in the traces, the router choosing among all the ranks,
    each engine's ranks sharing their steps and the two engines stepping apart."""
    setup = build_setup(example(*DP8[1:], "cluster.num_replicas=2", "workload.arrival.rate=8"))
    steps = pd.DataFrame(simulate(setup).step_columns())
    assert set(steps.replica) == set(range(16))
    steps["engine"] = steps.replica // 8
    assert steps.groupby(["engine", "start_time"]).duration.nunique().max() == 1
    first, second = (set(steps[steps.engine == engine].start_time) for engine in (0, 1))
    assert len(first & second) < 0.05 * min(len(first), len(second))


def test_a_dense_models_ranks_are_independent_replicas():
    """vLLM's data parallelism for a dense model is independent engines behind one load balancer: the same run as a
    cluster of that many replicas."""
    chat = ["workload.num_requests=200", "workload.arrival.rate=40"]
    ranks = simulate(build_setup(load_workload(example_path("chat"), overrides=[*chat, "engine.data_parallel_size=4"])))
    replicas = simulate(build_setup(load_workload(example_path("chat"), overrides=[*chat, "cluster.num_replicas=4"])))
    assert pd.DataFrame(ranks.step_columns()).equals(pd.DataFrame(replicas.step_columns()))
    assert pd.DataFrame(ranks.request_columns()).equals(pd.DataFrame(replicas.request_columns()))


@pytest.mark.parametrize("overrides, expected", [
    (["cluster={num_replicas: 2, prefill_replicas: 1}"], "cluster.prefill_replicas 1"),
    (["engine.speculative_decoding={method: draft_model, draft_model: llama-3.2-1b, num_speculative_tokens: 1, "
      "acceptance_rate: 0.8}"], "engine.speculative_decoding.method draft_model"),
    (["engine.async_scheduling=true"], "engine.async_scheduling: true"),
    (["engine.kv_offloading_size_gib=64"], "engine.kv_offloading_size_gib 64"),
])
def test_what_the_lockstep_loop_does_not_simulate_is_refused_by_name(overrides, expected):
    with pytest.raises(SetupError, match=r"^engine.data_parallel_size: 8 ranks") as error:
        build_setup(example(*DP8[1:], *overrides))
    assert expected in str(error.value)


def test_a_real_run_and_a_calibrated_profile_refuse_data_parallel_ranks():
    from sim.real_engine import build_real_engine

    with pytest.raises(SetupError, match=r"^engine.data_parallel_size: 8 ranks run in the simulator only"):
        build_real_engine(example(*DP8[1:]))
    with pytest.raises(ValueError, match="engine.data_parallel_size: 8 needs the analytical cost model"):
        from sim.cost_models import load_cost_model
        from sim.profile_match import SHIPPED_PROFILES_DIR

        load_cost_model(str(SHIPPED_PROFILES_DIR / "cpu-small-float32.json"), resolve_model("small"),
                        resolve_hardware("cpu"), "float32", data_parallel_size=8)
