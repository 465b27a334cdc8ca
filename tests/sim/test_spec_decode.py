"""Speculative decoding in the simulator (engine.speculative_decoding; sim/speculation.py, sim/speculative_executor.py).

Acceptances follow the configured probabilities and are the same run after run; every request still gets
exactly its output, every block comes back; speculation off is a run without it, to the byte; drafts pay off
when the engine is memory-bound and cost more than they save when they are mostly rejected; what the
simulator does not model with it is refused by field.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from engine.core import EngineCore, Scheduler
from sim.profile_match import SHIPPED_PROFILES_DIR
from sim.engine_setup import SetupError, build_setup
from sim.run_pipeline import run_simulation
from sim.simulator import Simulation
from sim.speculative_executor import SpeculatingExecutor, make_executor
from tests.sim.test_cluster import tables
from workloads import example_path, load_workload


def spec(num_speculative_tokens=3, acceptance_rate="0.6", *more: str) -> str:
    extra = "".join(f", {item}" for item in more)
    return (f"engine.speculative_decoding={{num_speculative_tokens: {num_speculative_tokens}, "
            f"acceptance_rate: {acceptance_rate}{extra}}}")


def chat(*overrides):
    return load_workload(example_path("chat"), overrides=["workload.num_requests=150", *overrides])


def simulate(workload, fast_forward=True):
    setup = build_setup(workload)
    engine = EngineCore(Scheduler(setup.scheduler_config, setup.cache_config),
                        make_executor(setup.cost_model, setup.speculation))
    simulation = Simulation(engine, setup.requests, fast_forward=fast_forward, host_link=setup.host_link)
    requests, steps = tables(simulation.run())
    return setup, engine, simulation, requests, steps


def without_wall_time(summary: dict) -> dict:
    return {key: value for key, value in summary.items() if key != "simulation_wall_s"}


def test_the_same_seed_gives_the_same_run_and_another_seed_other_acceptances(tmp_path):
    first = run_simulation(chat(spec()), tmp_path / "a")
    second = run_simulation(chat(spec()), tmp_path / "b")
    assert json.dumps(without_wall_time(first.summary)) == json.dumps(without_wall_time(second.summary))
    for table in ("requests.parquet", "steps.parquet"):
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "a" / table), pd.read_parquet(tmp_path / "b" / table),
                                      check_exact=True)
    other = run_simulation(chat(spec(), "seed=1"), None)
    assert other.summary["spec_decoding"]["num_accepted_tokens"] != first.summary["spec_decoding"]["num_accepted_tokens"]


def test_a_requests_acceptances_do_not_depend_on_the_requests_beside_it():
    # At 1 and at 30 requests a second the batches differ completely; each request draws the same acceptances.
    quiet = run_simulation(chat(spec(), "workload.arrival.rate=1"), None).summary["spec_decoding"]
    busy = run_simulation(chat(spec(), "workload.arrival.rate=30"), None).summary["spec_decoding"]
    assert quiet["num_accepted_tokens_per_position"] == busy["num_accepted_tokens_per_position"]


@pytest.mark.parametrize("acceptance_rate, expected", [
    ("0.6", [0.6, 0.6, 0.6]),
    ("[0.9, 0.5, 0.2]", [0.9, 0.5, 0.2]),
])
def test_measured_acceptance_is_what_was_configured(acceptance_rate, expected):
    # Long outputs: few drafts are trimmed short by the end of a request.
    workload = chat(spec(3, acceptance_rate), "workload.num_requests=200",
                    "workload.output_len={type: uniform, min: 300, max: 500}")
    stats = run_simulation(workload, None).summary["spec_decoding"]
    assert stats["num_drafts"] > 20_000
    assert stats["conditional_acceptance_per_position"] == pytest.approx(expected, abs=0.015)
    reaching = [1.0, expected[0], expected[0] * expected[1]]
    mean_length = 1 + sum(reach * rate for reach, rate in zip(reaching, expected))
    assert stats["mean_acceptance_length"] == pytest.approx(mean_length, rel=0.02)
    assert stats["acceptance_rate"] == pytest.approx(stats["num_accepted_tokens"] / stats["num_draft_tokens"])
    assert stats["num_draft_tokens"] <= 3 * stats["num_drafts"]


def test_an_ngram_lookup_that_offers_fewer_drafts_offers_what_was_configured():
    """proposal_rate: how many drafts each lookup offers, measured back per position; acceptance stays conditional
    on the drafts offered, and a lookup that finds nothing leaves its request a plain decode."""
    workload = chat(spec(3, "[0.9, 0.5, 0.2]", "proposal_rate: [0.75, 0.4, 0.5]"), "workload.num_requests=200",
                    "workload.output_len={type: uniform, min: 300, max: 500}")
    stats = run_simulation(workload, None).summary["spec_decoding"]
    assert stats["num_proposals"] > 40_000
    assert stats["proposal_rate_per_position"] == pytest.approx([0.75, 0.4, 0.5], abs=0.015)
    assert stats["conditional_acceptance_per_position"] == pytest.approx([0.9, 0.5, 0.2], abs=0.02)
    # Fewer draft tokens than with every proposal full: 0.75 * (1 + 0.4 + 0.2) per proposal.
    assert stats["num_draft_tokens"] / stats["num_drafts"] == pytest.approx((1 + 0.4 + 0.2) / 1, rel=0.03)
    full = run_simulation(chat(spec(3, "[0.9, 0.5, 0.2]"), "workload.num_requests=200",
                               "workload.output_len={type: uniform, min: 300, max: 500}"), None).summary
    assert full["spec_decoding"]["proposal_rate_per_position"] == [1.0, 1.0, 1.0]
    # Draft tokens per lookup: 0.75 * 1.6 = 1.2 against 3 (a little less for both at requests' ends).
    per_lookup = stats["num_draft_tokens"] / stats["num_proposals"]
    assert per_lookup == pytest.approx(0.75 * 1.6, rel=0.05)
    assert per_lookup < 0.45 * full["spec_decoding"]["num_draft_tokens"] / full["spec_decoding"]["num_proposals"]


def test_a_proposal_rate_of_one_is_a_run_without_it(tmp_path):
    plain = run_simulation(chat(spec()), tmp_path / "a")
    ones = run_simulation(chat(spec(3, "0.6", "proposal_rate: [1, 1, 1]")), tmp_path / "b")

    def outcome(summary):  # (the config echoes the workload as written)
        return json.dumps({key: value for key, value in without_wall_time(summary).items() if key != "config"})

    assert outcome(plain.summary) == outcome(ones.summary)
    for table in ("requests.parquet", "steps.parquet"):
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "a" / table), pd.read_parquet(tmp_path / "b" / table),
                                      check_exact=True)


@pytest.mark.parametrize("extra, message", [
    ("proposal_rate: 0.5, method: draft_model, draft_model: llama-3.2-1b", "proposal_rate.*only used with method: ngram"),
    ("proposal_rate: [0.5, 0.5]", "proposal_rate.*lists 2 per-position probabilities"),
    ("proposal_rate: 0", "proposal_rate.*probability in \\(0, 1\\]"),
])
def test_a_bad_proposal_rate_is_named(extra, message):
    from workloads import WorkloadError

    with pytest.raises(WorkloadError, match=message):
        chat(spec(3, "0.6", extra))


@pytest.mark.parametrize("overrides", [
    [],
    # A small KV cache at a high rate: requests are preempted with drafts, and recomputed.
    ["engine.num_gpu_blocks=200", "engine.max_model_len=2048", "workload.arrival.rate=40"],
    # Drafts cut by a small step budget, and by prompt chunks sharing it.
    ["engine.max_num_batched_tokens=64", "workload.arrival.rate=20"],
    ["cluster.num_replicas=2"],
    ["engine.kv_offloading_size_gib=4", "engine.num_gpu_blocks=400", "engine.max_model_len=2048"],
])
def test_every_request_gets_exactly_its_output_and_every_block_comes_back(overrides):
    workload = chat(spec(4, "0.7"), *overrides)
    setup = build_setup(workload)
    engines = [EngineCore(Scheduler(setup.scheduler_config, setup.cache_config),
                          make_executor(setup.cost_model, setup.speculation))
               for _ in range(workload.cluster.num_replicas)]
    from sim.replica_loads import ReplicaLoads
    from sim.router import make_router

    loads = ReplicaLoads(engines)
    router = make_router(workload, loads) if len(engines) > 1 else None
    requests, steps = tables(Simulation(engines, setup.requests, router=router, loads=loads,
                                        host_link=setup.host_link).run())
    output_len = {request.request_id: request.output_len for request in setup.requests}
    assert (requests["finish_reason"] == "length").all()
    assert (requests["num_output_tokens"] == requests["request_id"].map(output_len)).all()
    assert (requests["token_times"].map(len) == requests["num_output_tokens"]).all()
    for index, engine in enumerate(engines):
        manager = engine.scheduler.kv_cache_manager
        assert manager.num_free_blocks == manager.num_usable_blocks
        # Forgotten as requests finish (but those of its last step: the step after it would have said so).
        served = requests[requests["replica"] == index] if "replica" in requests else requests
        last_finished = set(served.loc[served["finish_time"] == served["finish_time"].max(), "request_id"])
        assert set(engine.executor.acceptances._keys) <= last_finished
    # Every scheduled token is a prompt token, a decode's own or a draft.
    assert (steps["num_scheduled_tokens"] == steps["num_prefill_tokens"] + steps["num_decode_reqs"]
            + steps["num_spec_tokens"]).all()
    assert steps["spec_accepted_tokens"].sum() == sum(
        engine.scheduler.spec_decoding_stats.num_accepted_tokens for engine in engines)
    if "engine.num_gpu_blocks=200" in overrides:
        assert requests["num_preemptions"].sum() > 0


def test_speculation_off_is_a_run_without_it(tmp_path):
    plain = run_simulation(chat(), tmp_path / "plain").summary
    null = run_simulation(chat("engine.speculative_decoding=null"), tmp_path / "null").summary
    zero = run_simulation(chat(spec(0)), tmp_path / "zero").summary
    assert json.dumps(without_wall_time(plain)) == json.dumps(without_wall_time(null))
    assert "spec_decoding" not in plain and "speculative_decoding" not in plain["config"]
    # With 0 drafts the section is recorded in the workload, and nothing else differs.
    zero["config"]["workload"]["engine"]["speculative_decoding"] = None
    assert json.dumps(without_wall_time(plain)) == json.dumps(without_wall_time(zero))
    for other in ("null", "zero"):
        for table in ("requests.parquet", "steps.parquet"):
            pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "plain" / table),
                                          pd.read_parquet(tmp_path / other / table), check_exact=True)


def test_the_fast_forward_stands_aside_only_when_speculating():
    *_, plain, _, _ = simulate(chat("workload.arrival.rate=2"))
    assert plain.num_fast_forwarded_steps > 0
    *_, on, requests_on, steps_on = simulate(chat(spec(), "workload.arrival.rate=2"))
    *_, off, requests_off, steps_off = simulate(chat(spec(), "workload.arrival.rate=2"), fast_forward=False)
    assert on.num_fast_forwarded_steps == 0 == off.num_fast_forwarded_steps
    pd.testing.assert_frame_equal(requests_on, requests_off, check_exact=True)
    pd.testing.assert_frame_equal(steps_on, steps_off, check_exact=True)


def tpot_p50(*overrides) -> float:
    return run_simulation(chat(*overrides), None).summary["tpot_ms"]["p50"]


def test_drafts_pay_off_at_low_load_and_cost_more_than_they_save_when_mostly_rejected():
    low_load = ["workload.arrival.rate=1", "workload.num_requests=60"]
    plain = tpot_p50(*low_load)
    good = run_simulation(chat(spec(3, "0.8"), *low_load), None).summary
    # 1 + 0.8 + 0.64 + 0.512 = 2.95 tokens per step for a step barely longer than a decode's.
    assert good["spec_decoding"]["mean_acceptance_length"] == pytest.approx(2.95, rel=0.03)
    assert good["tpot_ms"]["p50"] < plain / 2.5
    # Mostly rejected: about one token per step. Alone, an engine reads its weights for one row or four, so
    # n-gram drafts (a few microseconds of CPU) still gain their 5%; a draft model's three passes do not.
    bad = run_simulation(chat(spec(3, "0.05"), *low_load), None).summary
    assert bad["spec_decoding"]["mean_acceptance_length"] < 1.06
    assert 0.9 * plain < bad["tpot_ms"]["p50"] < plain
    assert tpot_p50(spec(3, "0.05", "method: draft_model", "draft_model: llama-3.2-1b"), *low_load) > 1.3 * plain
    # A busy engine (the chat example's own rate) pays for every draft row in its linear layers.
    busy = ["workload.arrival.rate=10", "workload.num_requests=300"]
    assert tpot_p50(spec(3, "0.05"), *busy) > tpot_p50(*busy)


def test_a_draft_model_costs_gpu_time_and_memory_that_ngrams_do_not():
    ngram = build_setup(chat(spec()))
    drafting = build_setup(chat(spec(3, "0.6", "method: draft_model", "draft_model: llama-3.2-1b")))
    # Its weights (2.5 GB) and its KV (a quarter of the target's per token) share the GPU.
    assert drafting.cache_config.num_gpu_blocks < 0.8 * ngram.cache_config.num_gpu_blocks
    assert drafting.describe()["speculative_decoding"]["draft_model"] == "llama-3.2-1b"
    assert "ngram_propose_s_per_request" in ngram.describe()["speculative_decoding"]
    low_load = ["workload.arrival.rate=1", "workload.num_requests=60"]
    with_ngrams = run_simulation(chat(spec(), *low_load), None).summary
    with_draft = run_simulation(chat(spec(3, "0.6", "method: draft_model", "draft_model: llama-3.2-1b"),
                                     *low_load), None).summary
    plain = run_simulation(chat(*low_load), None).summary
    assert with_ngrams["tpot_ms"]["p50"] < with_draft["tpot_ms"]["p50"] < plain["tpot_ms"]["p50"]


def test_a_cluster_sums_its_replicas_counts():
    workload = chat(spec(), "cluster.num_replicas=2", "cluster.router=round_robin")
    setup = build_setup(workload)
    whole = run_simulation(workload, None).summary["spec_decoding"]
    alone = [run_simulation(chat(spec(), "cluster.num_replicas=1"), None).summary["spec_decoding"]]
    assert whole["num_speculative_tokens"] == 3 and whole["num_drafts"] > 0
    # Acceptances are per request: the cluster verifies exactly what one engine serving everyone verifies,
    # up to drafts trimmed by each engine's step budget (none at this load).
    assert whole["num_accepted_tokens_per_position"] == alone[0]["num_accepted_tokens_per_position"]
    assert setup.scheduler_config.num_speculative_tokens == 3


@pytest.mark.parametrize("overrides, message", [
    (["engine.async_scheduling=true"], r"^engine\.speculative_decoding: .*engine\.async_scheduling"),
    (["engine.pipeline_parallel_size=2"], r"^engine\.speculative_decoding: .*pipeline parallelism"),
    (["cluster.num_replicas=2", "cluster.prefill_replicas=1"], r"^engine\.speculative_decoding: .*disaggregated"),
    ([spec(3, "0.6", "method: draft_model", "draft_model: no-such-model")],
     r"^engine\.speculative_decoding\.draft_model: model: 'no-such-model' is neither a preset"),
    ([spec(3, "0.6", "method: draft_model", "draft_model: llama-2-7b")],
     r"^engine\.speculative_decoding\.draft_model: 'llama-2-7b' has a vocabulary of 32,000 tokens"),
])
def test_what_speculation_is_not_simulated_with_is_refused_by_field(overrides, message):
    with pytest.raises(SetupError, match=message):
        build_setup(chat(spec(), *overrides))


def test_off_needs_no_refusal():
    for overrides in (["engine.async_scheduling=true"], ["engine.pipeline_parallel_size=2"]):
        assert build_setup(chat(spec(0), *overrides)).speculation is None


def test_a_calibrated_profile_fitted_without_drafts_refuses_speculation():
    # (A profile fitted on n-gram runs prices it: tests/sim/test_calibrated_speculation.py.)
    workload = load_workload(example_path("cpu_chat"), overrides=[spec()])
    with pytest.raises(SetupError, match=r"^engine\.speculative_decoding: the calibrated profile .* was fitted on steps "
                                         "without draft tokens"):
        build_setup(workload, str(SHIPPED_PROFILES_DIR / "cpu-small-float32.json"))
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SpeculatingExecutor(build_setup(chat(spec())).cost_model, build_setup(chat(spec())).speculation.__class__(
            0, (), "ngram", 0))


def test_the_example_sweeps_drafts_and_rates_and_reports_the_acceptance(tmp_path, capsys, monkeypatch):
    from analysis.dashboard import assemble_dashboard, prepare_runs
    from sim.run import main as sim_run_main

    monkeypatch.setenv("COLUMNS", "400")  # the comparison table of 16 runs, unwrapped
    out = tmp_path / "spec_decode"
    assert sim_run_main(["spec_decode", "--set", "workload.num_requests=40", "--out", str(out), "--no-progress"]) == 0
    assert "acceptance length" in capsys.readouterr().out
    table = pd.read_csv(out / "sweep.csv")
    assert len(table) == 16
    off = table["point"].str.endswith("num_speculative_tokens=0")
    assert table.loc[off, "spec_acceptance_length"].isna().all()
    assert (table.loc[~off, "spec_acceptance_length"] > 1.5).all()
    low = table[table["point"].str.startswith("rate=2,")].set_index("point")["tpot_ms_p50"]
    assert low["rate=2,num_speculative_tokens=3"] < low["rate=2,num_speculative_tokens=0"] / 2
    html = assemble_dashboard(prepare_runs([out])).html()
    assert "tokens per verification" in html
    summary = json.loads((out / "rate=2_num_speculative_tokens=3" / "summary.json").read_text())
    assert summary["spec_decoding"]["num_speculative_tokens"] == 3
    assert "tokens per verification" not in assemble_dashboard(
        prepare_runs([out / "rate=2_num_speculative_tokens=0"])).html()
