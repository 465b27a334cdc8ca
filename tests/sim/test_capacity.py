"""sim.capacity: the highest rate within the SLO, bracketed and bisected; what cannot be searched is named."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from sim.capacity import describe, find_capacity, main as capacity_main, probe, starting_rate
from workloads import example_path, load_workload

SMALL = ["workload.num_requests=200"]


def chat(*overrides):
    return load_workload(example_path("chat"), overrides=[*SMALL, *overrides])


def test_the_capacity_is_bracketed_within_the_tolerance():
    workload = chat()
    result = find_capacity(workload, attainment_target=0.9, tolerance=0.05, target_rate=250.0)
    assert result.max_rate is not None and result.first_failing_rate is not None
    assert (result.first_failing_rate - result.max_rate) / result.max_rate <= 0.05
    by_rate = {p.rate: p for p in result.probes}
    assert by_rate[result.max_rate].passed and not by_rate[result.first_failing_rate].passed
    assert by_rate[result.max_rate].slo_attainment >= 0.9 > by_rate[result.first_failing_rate].slo_attainment
    # The same requests at every rate: a probe is reproducible, and the replica count follows.
    assert probe(workload, result.max_rate, 0.9) == by_rate[result.max_rate]
    assert result.replicas == -(-250.0 // result.max_rate)
    # A stricter SLO can only lower the capacity.
    strict = find_capacity(chat("slo.ttft_ms=100"), attainment_target=0.9, tolerance=0.05)
    assert strict.max_rate < result.first_failing_rate


def test_an_slo_out_of_reach_is_said_so(tmp_path, capsys):
    assert capacity_main(["chat", *(f"--set={o}" for o in SMALL), "--set", "slo.ttft_ms=0.001",
                          "--out", str(tmp_path)]) == 0
    assert "out of reach" in capsys.readouterr().out
    saved = json.loads((tmp_path / "capacity.json").read_text())
    # Attainment stays at 0% however low the rate: the search stops after three halvings that gain nothing.
    assert saved["max_rate"] is None and len(saved["probes"]) == 4


def test_the_cli_writes_the_answer_and_the_run_at_capacity(tmp_path, capsys):
    assert capacity_main(["chat", *(f"--set={o}" for o in SMALL), "--tolerance", "0.1", "--target-rate", "90",
                          "--out", str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "capacity.json").read_text())
    assert saved["max_rate"] > 0 and saved["replicas"] >= 1 and len(saved["probes"]) >= 3
    assert (tmp_path / "at-capacity" / "summary.json").is_file() and (tmp_path / "at-capacity" / "dashboard.html").is_file()
    from analysis.dashboard.page import self_containment_problems

    page = (tmp_path / "capacity.html").read_text(encoding="utf-8")
    assert 'id="capacity-search"' in page and self_containment_problems(page) == []
    assert "replica(s)" in capsys.readouterr().out


@pytest.mark.parametrize("overrides, message", [
    (["slo=null"], "slo: the workload sets no SLO"),
    # TPOT counts admitted requests only: past saturation it stays put while the queue grows.
    (["slo.ttft_ms=null"], "slo: a TPOT-only SLO does not count waiting"),
    (["sweep={workload.arrival.rate: [1, 2]}"], "sweep.workload.arrival.rate: a capacity search varies the arrival rate"),
    (["workload.arrival={type: bursts, burst_size: 8, burst_interval_s: 5}"], "workload.arrival: bursts"),
])
def test_what_cannot_be_searched_is_named(overrides, message, capsys):
    assert capacity_main(["chat", *(f"--set={o}" for o in SMALL + overrides)]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [(["--attainment", "1.5"], "--attainment"),
                                            (["--target-rate", "-3"], "--target-rate")])
def test_bad_flags_are_named(flags, message, capsys):
    with pytest.raises(SystemExit) as raised:
        capacity_main(["chat", *flags])
    assert raised.value.code == 2 and message in capsys.readouterr().err


def test_a_trace_replay_starts_from_the_traces_own_rate():
    from sim.capacity import starting_rate

    workload = load_workload(example_path("code_trace"), overrides=["workload.num_requests=120"])
    rate = starting_rate(workload)
    assert 0.1 < rate < 100
    result = find_capacity(workload, tolerance=0.1)
    assert result.probes and any(p.rate == pytest.approx(rate) for p in result.probes)
    assert result.max_rate is not None


def test_no_replica_count_when_the_search_stops_at_its_limit(monkeypatch):
    # An SLO met at every rate: the search stops at its limit, which is no capacity, and a replica count
    # divided by it (1 for any target) would be false.
    monkeypatch.setattr("sim.capacity.MAX_RATE_STEPS", 2)
    result = find_capacity(chat("slo.ttft_ms=1e12", "slo.tpot_ms=1000"), target_rate=1000.0)
    assert result.max_rate is not None and result.first_failing_rate is None
    assert result.replicas is None


def test_a_duration_workload_keeps_its_requests_at_every_rate(monkeypatch):
    # With duration_s the request count grows with the rate: a loose SLO's doublings would simulate
    # millions of requests. Every probe holds the requests of the workload's own rate instead.
    import sim.capacity
    from sim.run_pipeline import run_simulation

    counts = []

    def counting_run(*args, **kwargs):
        result = run_simulation(*args, **kwargs)
        counts.append(result.summary["num_requests"])
        return result

    monkeypatch.setattr(sim.capacity, "run_simulation", counting_run)
    monkeypatch.setattr(sim.capacity, "MAX_RATE_STEPS", 3)
    workload = load_workload(example_path("chat"), overrides=["workload.num_requests=null", "workload.duration_s=15",
                                                              "slo.ttft_ms=1e12", "slo.tpot_ms=1000"])
    result = find_capacity(workload)
    assert result.first_failing_rate is None and len(counts) == 4
    assert 100 < counts[0] < 200 and set(counts) == {counts[0]}


def test_the_attainment_target_is_said_as_given():
    from sim.capacity import CapacityResult, describe

    result = CapacityResult("chat", {"ttft_ms": 500.0}, 0.999, 10.0, 11.0)
    assert "for 99.9% of requests" in describe(result)


def test_every_request_may_be_asked_to_meet_the_slo():
    result = find_capacity(chat(), attainment_target=1.0, tolerance=0.1)
    by_rate = {p.rate: p for p in result.probes}
    assert by_rate[result.max_rate].slo_attainment == 1.0 and by_rate[result.first_failing_rate].slo_attainment < 1.0


def test_a_sweep_searches_each_point(tmp_path, capsys):
    # What a smaller batch costs in capacity: one search per configuration, side by side.
    assert capacity_main(["chat", *(f"--set={o}" for o in SMALL), "--set", "sweep={engine.max_num_seqs: [8, 128]}",
                          "--tolerance", "0.1", "--out", str(tmp_path)]) == 0
    table = pd.read_csv(tmp_path / "capacity.csv")
    assert list(table["point"]) == ["max_num_seqs=8", "max_num_seqs=128"]
    assert table["max_rate"].iloc[0] < table["max_rate"].iloc[1]
    for point in table["point"]:
        saved = json.loads((tmp_path / point / "capacity.json").read_text())
        assert saved["max_rate"] == table.set_index("point").loc[point, "max_rate"]
        assert (tmp_path / point / "at-capacity" / "summary.json").is_file()
    assert "capacity per sweep point" in capsys.readouterr().out


def test_the_target_rate_is_checked_on_one_routed_cluster():
    # 1,000 requests per replica: long enough for the queues to build at the boundary.
    result = find_capacity(chat("workload.num_requests=1000"), tolerance=0.05, target_rate=68.0)
    count = result.replica_count
    assert result.replicas == 3 and count is not None and count.router == "least_loaded"
    by_replicas = {check.replicas: check for check in count.checks}
    assert by_replicas[result.replicas].passed  # the estimate was simulated first
    # The fewest that pass, with the one below failing: vLLM's router pools the queues, which an even
    # split of the traffic into separate queues leaves out.
    assert count.fewest_passing == 2 and not by_replicas[1].passed
    assert "simulated as one cluster behind its router (least_loaded): 2 replica(s)" in describe(result)


def test_a_stream_too_short_for_the_cluster_is_said_so():
    workload = load_workload(example_path("code_trace"), overrides=["workload.num_requests=600"])
    result = find_capacity(workload, tolerance=0.1, target_rate=50 * starting_rate(workload))
    assert result.replica_count is None and "not simulated as one cluster" in result.verification_note


def test_the_capacity_is_priced_per_million_output_tokens_on_all_its_gpus():
    from sim.capacity import CapacityResult, Probe

    # The run served 8 req/s over its whole span (its drain after the last arrival included), 100 output
    # tokens a request: at the 10 req/s it sustains, 1,000 output tokens a second.
    at_capacity = Probe(10.0, 0.95, True, 7.6, 8.0, 100.0, 20.0, 2000.0, output_token_throughput=800.0)
    result = CapacityResult("chat", {"ttft_ms": 500}, 0.9, max_rate=10.0, first_failing_rate=11.0,
                            probes=[at_capacity], cluster_size=2, gpus_per_replica=4)
    result.price(2.0)
    # 8 GPUs at $2 an hour serve 3.6 million output tokens an hour.
    assert result.num_gpus == 8 and result.usd_per_million_output_tokens == pytest.approx(16 / 3.6)
    assert "1,000 output tokens/s on 8 GPU(s) at $2 per GPU-hour: $4.444 per million output tokens" in describe(result)
    unbracketed = CapacityResult("chat", {"ttft_ms": 500}, 0.9, max_rate=10.0, first_failing_rate=None,
                                 probes=[at_capacity])
    unbracketed.price(2.0)
    assert unbracketed.usd_per_million_output_tokens is None  # no failing rate above it: not a capacity


def test_the_cli_prices_the_capacity_and_refuses_a_bad_price(tmp_path, capsys):
    assert capacity_main(["chat", *(f"--set={o}" for o in SMALL), "--tolerance", "0.2", "--gpu-hour-price", "3",
                          "--out", str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "capacity.json").read_text())
    assert saved["gpu_hour_price"] == 3 and saved["usd_per_million_output_tokens"] > 0
    assert "per million output tokens" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        capacity_main(["chat", "--gpu-hour-price", "-1"])
    assert "--gpu-hour-price: must be a positive number of dollars, got -1" in capsys.readouterr().err


def test_a_cluster_too_large_to_simulate_keeps_the_search_and_says_why(monkeypatch):
    import sim.engine_setup

    # One replica's pool fits under the cap, two do not: the search runs, the cluster check cannot.
    one_replica = sim.engine_setup.build_setup(chat()).cache_config.num_gpu_blocks \
        * sim.engine_setup.BYTES_PER_SIMULATED_BLOCK
    monkeypatch.setattr(sim.engine_setup, "MAX_SIMULATED_POOL_BYTES", int(1.5 * one_replica))
    result = find_capacity(chat(), tolerance=0.2, target_rate=300.0)
    assert result.max_rate is not None and result.replicas >= 2 and result.replica_count is None
    assert result.verification_note.startswith("not simulated as one cluster: cluster.num_replicas:")


def test_a_search_over_sessions_says_the_rate_counts_sessions(tmp_path, capsys):
    assert capacity_main(["multi_turn", "--set", "sweep=null", "--set", "workload.num_requests=40", "--tolerance",
                          "0.2", "--out", str(tmp_path / "cap")]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "the rate counts sessions (their first turns)" in printed
