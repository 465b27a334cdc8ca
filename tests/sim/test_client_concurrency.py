"""workload.max_concurrency: a client that keeps at most N requests in flight (vLLM's bench serve
--max-concurrency), in the simulator, a wall-clock run and its replay, and against a server."""

from __future__ import annotations

import copy
import time

import pandas as pd
import pytest

from analysis import read_run, requests_table, steps_table
from engine.core import CacheConfig, EngineCore, Scheduler, SchedulerConfig, ScriptedExecutor
from sim.capacity import check_searchable
from sim.client_concurrency import ConcurrencyLimit
from sim.real_run import run_real
from sim.replay import compare_replay, replay
from sim.run_pipeline import run_simulation
from workloads import RequestSpec, WorkloadError, generate_requests, load_workload

CLOSED_LOOP = {
    "name": "closed-loop", "seed": 3, "model": "llama-3-8b", "hardware": "h100-sxm",
    "engine": {"max_num_seqs": 256, "max_num_batched_tokens": 4096, "max_model_len": 8192},
    "workload": {"num_requests": 300, "arrival": {"type": "at_once"}, "max_concurrency": 16,
                 "prompt_len": {"type": "lognormal", "mean": 700, "sigma": 0.6, "max": 4000},
                 "output_len": {"type": "uniform", "min": 20, "max": 300}},
}


def with_changes(raw: dict, **workload_changes) -> dict:
    raw = copy.deepcopy(raw)
    raw["workload"].update(workload_changes)
    return raw


def max_in_flight(requests: pd.DataFrame) -> int:
    # A finish and a send at the same instant: the finish first (the send takes the slot it frees).
    events = sorted([(t, 1) for t in requests["arrival_time"]] + [(t, -1) for t in requests["finish_time"]])
    in_flight = largest = 0
    for _, change in events:
        in_flight += change
        largest = max(largest, in_flight)
    return largest


def simulate(raw: dict, tmp_path, name: str, fast_forward: bool = True):
    result = run_simulation(load_workload(raw), tmp_path / name, progress=False, fast_forward=fast_forward)
    run = read_run(tmp_path / name)
    return run.requests, run.steps, result.summary


def spec(request_id: str, arrival_time: float) -> RequestSpec:
    from array import array
    return RequestSpec(request_id, arrival_time, array("q", [1, 2, 3]), 4)


def test_the_limit_holds_requests_in_arrival_order_and_sends_one_per_finish():
    limit = ConcurrencyLimit(2)
    assert limit.offer(spec("a", 0.0)).request_id == "a" and limit.offer(spec("b", 0.5)).request_id == "b"
    assert limit.offer(spec("c", 1.0)) is None and limit.offer(spec("d", 1.5)) is None
    sent = limit.on_finished(3.0)
    assert (sent.request_id, sent.arrival_time) == ("c", 3.0)  # it arrives when it is sent
    assert limit.in_flight == 2 and [s.request_id for s in limit.waiting] == ["d"]
    assert sent.client_wait_s == pytest.approx(2.0)  # it waited from its arrival at 1.0 until 3.0
    later = limit.on_finished(4.0)
    assert later.request_id == "d" and later.client_wait_s == pytest.approx(2.5)
    assert limit.on_finished(5.0) is None and limit.in_flight == 1
    with pytest.raises(ValueError, match="max_concurrency must be >= 1"):
        ConcurrencyLimit(0)


@pytest.fixture(scope="module")
def closed_loop(tmp_path_factory):
    return simulate(CLOSED_LOOP, tmp_path_factory.mktemp("closed"), "run")


def test_a_closed_loop_keeps_exactly_its_limit_in_flight(closed_loop):
    requests, _, summary = closed_loop
    assert summary["num_finished"] == 300
    assert max_in_flight(requests) == 16
    assert (requests["arrival_time"] == 0).sum() == 16
    # Every other request is sent the moment one in flight finishes.
    finishes = set(requests["finish_time"])
    later = requests.loc[requests["arrival_time"] > 0, "arrival_time"]
    assert later.isin(finishes).all()


def test_the_fast_forward_leaves_a_closed_loop_as_ordinary_steps_do(closed_loop, tmp_path):
    requests, steps, _ = closed_loop
    slow_requests, slow_steps, _ = simulate(CLOSED_LOOP, tmp_path, "slow", fast_forward=False)
    pd.testing.assert_frame_equal(requests.drop(columns="token_times"), slow_requests.drop(columns="token_times"))
    pd.testing.assert_frame_equal(steps, slow_steps)


def test_one_slot_serves_the_requests_one_after_the_other(tmp_path):
    requests, _, _ = simulate(with_changes(CLOSED_LOOP, max_concurrency=1, num_requests=20), tmp_path, "one")
    ordered = requests.sort_values("arrival_time")
    assert ordered["arrival_time"].iloc[1:].tolist() == ordered["finish_time"].iloc[:-1].tolist()


def test_an_open_loop_beyond_the_limit_waits_at_the_client(tmp_path):
    raw = with_changes(CLOSED_LOOP, arrival={"type": "poisson", "rate": 40}, max_concurrency=8)
    requests, _, summary = simulate(raw, tmp_path, "open")
    assert max_in_flight(requests) == 8 and summary["num_finished"] == 300
    # Each request's wait at the client is recorded: sent time less its own arrival time.
    intended = {spec.request_id: spec.arrival_time for spec in generate_requests(load_workload(raw), 128256)}
    waited = requests["arrival_time"] - requests["request_id"].map(intended)
    assert requests["client_wait_s"].to_numpy() == pytest.approx(waited.to_numpy(), abs=1e-9)
    assert summary["num_client_waited"] == int((waited > 0).sum()) > 200
    assert summary["client_wait_ms"]["p50"] == pytest.approx(1000 * waited.median(), rel=1e-6)
    unlimited, _, unlimited_summary = simulate(with_changes(raw, max_concurrency=None), tmp_path, "unlimited")
    assert max_in_flight(unlimited) > 8
    assert "client_wait_s" not in unlimited.columns and "client_wait_ms" not in unlimited_summary
    # The engine sees fewer requests at once: each is served faster, and the run takes longer.
    assert summary["tpot_ms"]["p50"] < unlimited_summary["tpot_ms"]["p50"]
    assert summary["duration_s"] > unlimited_summary["duration_s"]


def test_throughput_grows_with_the_limit_until_the_engine_saturates(tmp_path):
    throughput = [simulate(with_changes(CLOSED_LOOP, max_concurrency=limit), tmp_path, f"c{limit}")[2]
                  ["output_token_throughput"] for limit in (1, 4, 16, 64)]
    assert throughput == sorted(throughput) and throughput[-1] > 5 * throughput[0]


@pytest.mark.parametrize("changes, field, message", [
    ({"max_concurrency": 0}, "workload.max_concurrency", "greater than 0"),
    ({"arrival": {"type": "at_once"}, "num_requests": None, "duration_s": 10}, "workload.duration_s",
     "set num_requests with arrival.type at_once"),
])
def test_bad_limits_are_named(changes, field, message):
    raw = copy.deepcopy(CLOSED_LOOP)
    for key, value in changes.items():
        if value is None:
            raw["workload"].pop(key)
        else:
            raw["workload"][key] = value
    with pytest.raises(WorkloadError) as error:
        load_workload(raw)
    assert field in str(error.value) and message in str(error.value)


def test_a_class_has_no_limit_of_its_own():
    raw = with_changes(CLOSED_LOOP, classes=[{"name": "batch", "num_requests": 5, "arrival": {"type": "at_once"},
                                              "max_concurrency": 2, "prompt_len": {"type": "constant", "value": 9},
                                              "output_len": {"type": "constant", "value": 9}}])
    with pytest.raises(WorkloadError, match=r"workload.classes\[0\].max_concurrency"):
        load_workload(raw)


def test_a_capacity_search_refuses_arrivals_all_at_once():
    config = load_workload(dict(CLOSED_LOOP, slo={"ttft_ms": 500}))
    with pytest.raises(ValueError, match="at_once has no rate to search"):
        check_searchable(config)


class SlowScriptedExecutor(ScriptedExecutor):
    def execute_model(self, scheduler_output):
        time.sleep(0.001)
        return super().execute_model(scheduler_output)


@pytest.mark.parametrize("sessions", [False, True])
def test_a_wall_clock_run_under_a_limit_replays_exactly(tmp_path, sessions):
    raw = {"name": "limit-real", "seed": 8, "model": "tiny",
           "engine": {"block_size": 16, "num_gpu_blocks": 80, "max_num_seqs": 8, "max_num_batched_tokens": 64,
                      "max_model_len": 1024, "enable_prefix_caching": True},
           "workload": {"num_requests": 24, "arrival": {"type": "poisson", "rate": 400}, "max_concurrency": 5,
                        "prompt_len": {"type": "uniform", "min": 20, "max": 90},
                        "output_len": {"type": "uniform", "min": 4, "max": 30}}}
    if sessions:
        raw["workload"]["sessions"] = {"turns": {"type": "constant", "value": 2},
                                       "user_len": {"type": "uniform", "min": 5, "max": 20},
                                       "think_time_s": {"type": "constant", "value": 0}}
    workload = load_workload(raw)
    engine = EngineCore(Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=1024),
                                  CacheConfig(block_size=16, num_gpu_blocks=80, enable_prefix_caching=True)),
                        SlowScriptedExecutor(vocab_size=1000))
    run_real(workload, tmp_path / "real", engine, vocab_size=1000, reserved_token_ids=[0, 1])
    real = read_run(tmp_path / "real").requests
    assert len(real) == (48 if sessions else 24) and max_in_flight(real) == 5
    assert (real["arrival_time"] > 0.06).any()  # some waited: 24 requests arrive within about 60 ms
    intended = {spec.request_id: spec.arrival_time for spec in generate_requests(workload, 1000, [0, 1])}
    first_turns = real[real["request_id"].isin(intended)]
    assert (first_turns["arrival_time"] - first_turns["client_wait_s"]).to_numpy() == pytest.approx(
        first_turns["request_id"].map(intended).to_numpy(), abs=1e-9)
    assert (real["client_wait_s"] > 0).sum() >= 5
    recorder, run, _ = replay(tmp_path / "real")
    report = compare_replay(run, requests_table(recorder.request_columns()).to_pandas(),
                            steps_table(recorder.step_columns()).to_pandas())
    assert report.identical, report.describe()


def test_a_server_run_keeps_its_limit_too(tmp_path):
    pytest.importorskip("fastapi")
    from engine.async_llm import AsyncLLM
    from engine.serve import ServerThread, build_app
    from sim.run import main as run_main

    engine = AsyncLLM(model="tiny", max_num_seqs=8, num_gpu_blocks=128, max_model_len=256)
    with ServerThread(build_app(engine, "tiny", shutdown_engine=True)) as server:
        assert run_main(["chat", "--executor", "server", "--url", server.url, "--set", "workload.num_requests=8",
                         "--set", "workload.arrival={type: at_once}", "--set", "workload.max_concurrency=3",
                         "--set", "workload.prompt_len={type: constant, value: 20}", "--set",
                         "workload.output_len={type: constant, value: 6}", "--set", "engine.max_model_len=256",
                         "--set", "workload.shared_prefix=null", "--out", str(tmp_path / "served"), "--no-dashboard",
                         "--no-progress"]) == 0
    engine.shutdown()
    requests = read_run(tmp_path / "served").requests
    assert len(requests) == 8 and (requests["finish_reason"] == "length").all()
    # Sent three at a time: the fourth leaves only when one of the first three is done, and says how long it waited.
    assert max_in_flight(requests) == 3
    assert (requests["client_wait_s"] > 0).sum() >= 5
    assert sorted(requests["arrival_time"])[3] >= sorted(requests["finish_time"])[0] - 1e-3
