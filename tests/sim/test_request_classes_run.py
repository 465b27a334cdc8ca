"""Request classes through the executors: each request's class from its RequestSpec to requests.parquet, and
the shipped example's sweep (batch rate doubled under fcfs and priority) with its per-class columns."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis import read_run
from sim.capacity import check_searchable
from sim.run import main as sim_run_main
from sim.run_pipeline import run_simulation
from workloads import example_path, generate_requests, load_workload

TWO_CLASSES = {
    "name": "two-classes", "seed": 3, "model": "tiny", "hardware": "cpu", "dtype": "float32",
    "engine": {"block_size": 16, "num_gpu_blocks": 64, "max_num_seqs": 8, "max_num_batched_tokens": 128,
               "max_model_len": 256, "scheduling_policy": "priority"},
    "workload": {"class_name": "chat", "num_requests": 8, "arrival": {"type": "poisson", "rate": 40},
                 "prompt_len": {"type": "uniform", "min": 8, "max": 32}, "output_len": {"type": "constant", "value": 4},
                 "classes": [{"name": "batch", "num_requests": 4, "start_s": 0.02, "arrival": {"type": "poisson", "rate": 40},
                              "prompt_len": {"type": "constant", "value": 96}, "output_len": {"type": "constant", "value": 8},
                              "priority": {"levels": [1]}, "slo": {"e2e_ms": 60000}}]},
    "slo": {"ttft_ms": 1000},
}


def assert_classes_recorded(run_dir, workload, vocab_size: int, reserved=()) -> None:
    specs = generate_requests(workload, vocab_size=vocab_size, reserved_token_ids=reserved)
    requests = read_run(run_dir).requests.set_index("request_id")
    assert len(requests) == len(specs)
    assert {spec.request_id: spec.request_class for spec in specs} == requests["request_class"].to_dict()
    assert set(read_run(run_dir).summary["by_class"]) == {"chat", "batch"}


def test_a_simulated_run_records_each_request_class(tmp_path):
    workload = load_workload(TWO_CLASSES, overrides=["model=llama-3-8b", "hardware=h100-sxm", "dtype=bfloat16",
                                                     "engine.num_gpu_blocks=null"])
    result = run_simulation(workload, tmp_path / "sim")
    assert_classes_recorded(tmp_path / "sim", workload, vocab_size=128256)
    assert result.summary["by_class"]["batch"]["slo"] == {"e2e_ms": 60000.0}


def test_a_cluster_run_keeps_the_class_beside_the_replica(tmp_path):
    workload = load_workload(TWO_CLASSES, overrides=["model=llama-3-8b", "hardware=h100-sxm", "dtype=bfloat16",
                                                     "engine.num_gpu_blocks=null", "cluster.num_replicas=2",
                                                     "cluster.router=round_robin"])
    run_simulation(workload, tmp_path / "cluster")
    assert_classes_recorded(tmp_path / "cluster", workload, vocab_size=128256)
    assert set(read_run(tmp_path / "cluster").requests["replica"]) == {0, 1}


def test_a_real_run_records_each_request_class(tmp_path):
    pytest.importorskip("torch")
    from sim.real_engine import build_real_engine
    from sim.real_run import run_real

    workload = load_workload(TWO_CLASSES)
    real = build_real_engine(workload, model="tiny", threads=1)
    run_real(workload, tmp_path / "real", real.engine, vocab_size=real.vocab_size,
             reserved_token_ids=real.reserved_token_ids, executor_info=real.info)
    assert_classes_recorded(tmp_path / "real", workload, real.vocab_size, real.reserved_token_ids)


def test_a_capacity_search_refuses_classes():
    with pytest.raises(ValueError, match=r"workload\.classes: a capacity search varies one arrival rate"):
        check_searchable(load_workload(TWO_CLASSES))


def test_the_example_sweep_shows_priority_protecting_the_interactive_class(tmp_path):
    out = tmp_path / "request_classes"
    assert sim_run_main(["request_classes", "--out", str(out), "--no-progress", "--no-dashboard"]) == 0
    table = pd.read_csv(out / "sweep.csv").set_index("point")
    assert len(table) == 6
    fcfs, priority = table.loc["scheduling_policy=fcfs,rate=4"], table.loc["scheduling_policy=priority,rate=4"]
    # Doubling the batch rate twice costs the interactive class under either policy...
    assert table.loc["scheduling_policy=fcfs,rate=1", "interactive.ttft_ms_p90"] < fcfs["interactive.ttft_ms_p90"]
    # ...and at the highest rate priority scheduling keeps more of its TTFT SLO than fcfs does.
    assert priority["interactive.ttft_ms_p90"] < 0.5 * fcfs["interactive.ttft_ms_p90"]
    assert priority["interactive.slo_attainment"] > fcfs["interactive.slo_attainment"] + 0.1
    # Each class draws its own requests: the batch rate leaves the interactive requests as they were.
    workload = load_workload(example_path("request_classes"))
    points = dict(workload.sweep_points())
    interactive = [[(r.arrival_time, r.prompt_token_ids) for r in generate_requests(points[label], 128256)
                    if r.request_class == "interactive"]
                   for label in ("scheduling_policy=fcfs,rate=1", "scheduling_policy=fcfs,rate=4")]
    assert interactive[0] == interactive[1]
