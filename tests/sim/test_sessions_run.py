"""Multi-turn sessions in the simulator and the wall-clock driver: each later turn arrives its think time after the
turn before it finished, resends that turn's whole sequence, and a replay of a wall-clock run reproduces it all."""

from __future__ import annotations

import copy
import time

import numpy as np
import pandas as pd
import pytest

from analysis import read_run, requests_table, steps_table
from engine.core import CacheConfig, EngineCore, Scheduler, SchedulerConfig, ScriptedExecutor
from sim.real_run import run_real
from sim.replay import compare_replay, replay
from sim.run import main as sim_run_main
from sim.run_pipeline import run_simulation
from workloads import generate_requests, load_workload
from workloads.request_spec import count_requests

SMALL = {
    "name": "sessions-sim", "seed": 11, "model": "llama-3-8b", "hardware": "h100-sxm",
    "engine": {"block_size": 16, "num_gpu_blocks": 3000, "max_num_seqs": 64, "max_num_batched_tokens": 2048,
               "max_model_len": 8192, "enable_prefix_caching": True},
    "workload": {"num_requests": 80, "arrival": {"type": "poisson", "rate": 6},
                 "prompt_len": {"type": "lognormal", "mean": 500, "sigma": 0.6, "max": 3000},
                 "output_len": {"type": "uniform", "min": 20, "max": 200},
                 "sessions": {"turns": {"type": "uniform", "min": 1, "max": 5},
                              "user_len": {"type": "uniform", "min": 20, "max": 120},
                              "think_time_s": {"type": "exponential", "mean": 1.5}}},
}


def config_with(**changes) -> dict:
    raw = copy.deepcopy(SMALL)
    for path, value in changes.items():
        section = raw
        *parents, leaf = path.split("__")
        for key in parents:
            section = section.setdefault(key, {})
        section[leaf] = value
    return raw


def simulate(raw: dict, tmp_path, name: str, fast_forward: bool = True) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    result = run_simulation(load_workload(raw), tmp_path / name, progress=False, fast_forward=fast_forward)
    run = read_run(tmp_path / name)
    return run.requests, run.steps, result.summary


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    return simulate(SMALL, tmp_path_factory.mktemp("sessions"), "run")


def test_every_turn_arrives_its_think_time_after_the_turn_before_finished(simulated):
    requests, _, summary = simulated
    specs = {spec.request_id: spec for spec in generate_requests(load_workload(SMALL), vocab_size=128256)}
    assert len(requests) == count_requests(specs.values()) == summary["num_finished"] > 200
    by_id = requests.set_index("request_id")
    checked = 0
    for first in specs.values():
        previous = first.request_id
        length = first.total_len
        for turn in first.next_turns:
            row, before = by_id.loc[turn.request_id], by_id.loc[previous]
            assert row["session_id"] == first.request_id
            assert row["arrival_time"] == pytest.approx(before["finish_time"] + turn.think_time_s, abs=1e-9)
            # The whole conversation so far, then the user's new tokens.
            assert row["num_prompt_tokens"] == length + len(turn.user_token_ids)
            length = row["num_prompt_tokens"] + turn.output_len
            previous = turn.request_id
            checked += 1
    assert checked > 100
    assert sorted(requests["turn"].unique().tolist()) == [1, 2, 3, 4, 5]


def test_later_turns_find_their_history_in_the_prefix_cache(simulated, tmp_path):
    requests, _, summary = simulated
    later = requests[requests["turn"] > 1]
    # All but the last partial block and the new user tokens of most later turns come from the cache.
    assert (later["num_cached_tokens"] > 0).mean() > 0.9
    assert summary["sessions"]["later_turns"]["cached_fraction"] > 0.6
    assert summary["sessions"]["by_turn"][0]["cached_fraction"] < 0.05
    assert summary["sessions"]["num_sessions"] == 80
    no_cache, _, no_cache_summary = simulate(config_with(engine__enable_prefix_caching=False), tmp_path, "no-cache")
    assert no_cache["num_cached_tokens"].sum() == 0
    assert no_cache_summary["sessions"]["later_turns"]["ttft_ms_p50"] > 1.5 * summary["sessions"]["later_turns"]["ttft_ms_p50"]


def test_the_fast_forward_leaves_a_sessions_run_as_ordinary_steps_do(simulated, tmp_path):
    requests, steps, _ = simulated
    slow_requests, slow_steps, _ = simulate(SMALL, tmp_path, "slow", fast_forward=False)
    for frame, other in ((requests, slow_requests), (steps, slow_steps)):
        columns = [c for c in frame.columns if c != "token_times"]
        pd.testing.assert_frame_equal(frame[columns].reset_index(drop=True), other[columns].reset_index(drop=True))


def test_a_turn_without_think_time_joins_the_step_after_the_one_that_finished_its_predecessor(tmp_path):
    raw = config_with(workload__sessions__think_time_s={"type": "constant", "value": 0},
                      workload__arrival={"type": "poisson", "rate": 0.5}, workload__num_requests=10)
    requests, steps, _ = simulate(raw, tmp_path, "no-think")
    by_id = requests.set_index("request_id")
    later = requests[requests["turn"] > 1]
    assert len(later) > 5
    for _, row in later.iterrows():
        before = by_id.loc[row["session_id"] if row["turn"] == 2 else f"{row['session_id']}-turn{row['turn'] - 1}"]
        assert row["arrival_time"] == before["finish_time"]
        # The next step starts where the finishing one ended, and schedules the new turn.
        assert row["scheduled_time"] == before["finish_time"]


@pytest.mark.parametrize("router, better", [("round_robin", False), ("prefix_aware", True)])
def test_a_cluster_routes_each_turn_and_a_prefix_aware_router_keeps_sessions_with_their_history(
        tmp_path, router, better):
    raw = config_with(cluster={"num_replicas": 3, "router": router})
    requests, _, summary = simulate(raw, tmp_path, router)
    assert summary["num_finished"] == len(requests) > 200
    cached = summary["sessions"]["later_turns"]["cached_fraction"]
    # Round robin sends a turn to another replica two times in three, where none of its history lies.
    assert (cached > 0.6) == better


def test_async_scheduling_runs_sessions_to_the_end(tmp_path):
    requests, _, summary = simulate(config_with(engine__async_scheduling=True), tmp_path, "async")
    assert summary["num_finished"] == len(requests) == summary["sessions"]["num_requests"] > 200


def test_the_example_sweeps_the_kv_pool_and_reports_the_turns(tmp_path, capsys):
    out = tmp_path / "multi_turn"
    assert sim_run_main(["multi_turn", "--out", str(out), "--no-progress", "--no-dashboard",
                         "--set", "workload.num_requests=60"]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "later turns" in printed  # the sweep table's row of cached history
    table = pd.read_csv(out / "sweep.csv")
    assert table["later_turns_cached_fraction"].is_monotonic_decreasing  # smaller pools hold less history
    assert table["later_turns_cached_fraction"].iloc[0] > 0.8


class SlowScriptedExecutor(ScriptedExecutor):
    """Steps of a couple of milliseconds, so that requests and turns overlap as they would on a model."""

    def execute_model(self, scheduler_output):
        time.sleep(0.001)
        return super().execute_model(scheduler_output)


@pytest.mark.parametrize("think_time", [{"type": "constant", "value": 0}, {"type": "exponential", "mean": 0.01}])
def test_a_wall_clock_run_sends_each_turn_with_its_generated_tokens_and_replays_exactly(tmp_path, think_time):
    raw = {"name": "sessions-real", "seed": 4, "model": "tiny",
           "engine": {"block_size": 16, "num_gpu_blocks": 60, "max_num_seqs": 8, "max_num_batched_tokens": 64,
                      "max_model_len": 1024, "enable_prefix_caching": True},
           "workload": {"num_requests": 12, "arrival": {"type": "poisson", "rate": 100},
                        "prompt_len": {"type": "uniform", "min": 20, "max": 90},
                        "output_len": {"type": "uniform", "min": 4, "max": 30},
                        "sessions": {"turns": {"type": "constant", "value": 3},
                                     "user_len": {"type": "uniform", "min": 5, "max": 40},
                                     "think_time_s": think_time}}}
    workload = load_workload(raw)
    engine = EngineCore(Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=1024),
                                  CacheConfig(block_size=16, num_gpu_blocks=60, enable_prefix_caching=True)),
                        SlowScriptedExecutor(vocab_size=1000))
    added = {}
    add_request = engine.add_request
    engine.add_request = lambda request: (added.__setitem__(request.request_id, request), add_request(request))[1]
    result = run_real(workload, tmp_path / "real", engine, vocab_size=1000, reserved_token_ids=[0, 1])
    assert result.summary["num_finished"] == len(added) == 36
    for request_id, request in added.items():
        if request_id.endswith("-turn2") or request_id.endswith("-turn3"):
            turn = int(request_id[-1])
            before = added[request_id[:-6] if turn == 2 else request_id[:-1] + "2"]
            history = list(before.all_token_ids)
            assert len(before.output_token_ids) == before.max_tokens
            assert list(request.prompt_token_ids[:len(history)]) == history
    real_requests = read_run(tmp_path / "real").requests
    assert (real_requests.loc[real_requests["turn"] > 1, "num_cached_tokens"] > 0).mean() > 0.8

    recorder, run, _ = replay(tmp_path / "real")
    report = compare_replay(run, requests_table(recorder.request_columns()).to_pandas(),
                            steps_table(recorder.step_columns()).to_pandas())
    assert report.identical, report.describe()
    replayed = requests_table(recorder.request_columns()).to_pandas().set_index("request_id")
    np.testing.assert_allclose(replayed.loc[real_requests["request_id"], "arrival_time"],
                               real_requests["arrival_time"], rtol=0, atol=1e-9)


def test_a_server_run_resends_each_conversation_with_the_token_ids_the_server_returned(tmp_path):
    pytest.importorskip("fastapi")
    from engine.async_llm import AsyncLLM
    from engine.serve import ServerThread, build_app

    raw = {"name": "sessions-served", "seed": 2, "engine": {"max_model_len": 256},
           "workload": {"num_requests": 4, "arrival": {"type": "poisson", "rate": 20}, "max_concurrency": 3,
                        "prompt_len": {"type": "uniform", "min": 10, "max": 40},
                        "output_len": {"type": "uniform", "min": 3, "max": 12},
                        "sessions": {"turns": {"type": "constant", "value": 3},
                                     "user_len": {"type": "uniform", "min": 3, "max": 15},
                                     "think_time_s": {"type": "constant", "value": 0.01}}}}
    engine = AsyncLLM(model="tiny", max_num_seqs=8, num_gpu_blocks=128, max_model_len=256)
    with ServerThread(build_app(engine, "tiny", shutdown_engine=True)) as server:
        from sim.server_run import run_against_server

        summary = run_against_server(load_workload(raw), server.url, tmp_path / "served")
    engine.shutdown()
    requests = read_run(tmp_path / "served").requests.set_index("request_id")
    assert summary["num_finished"] == len(requests) == 12 and summary["sessions"]["num_sessions"] == 4
    specs = generate_requests(load_workload(raw), vocab_size=summary["config"]["vocab_size"],
                              reserved_token_ids=summary["config"]["reserved_token_ids"], model_max_len=256)
    for first in specs:
        previous, length = first.request_id, first.total_len
        for turn in first.next_turns:
            row, before = requests.loc[turn.request_id], requests.loc[previous]
            # The whole conversation (prompt and the answer's ids as the server returned them), then the user's.
            assert row["num_prompt_tokens"] == length + len(turn.user_token_ids)
            assert row["arrival_time"] >= before["finish_time"] + 0.01
            assert (row["session_id"], row["turn"]) == (first.request_id, before["turn"] + 1)
            # The server found the previous turn's computed blocks (16 tokens each; its last sampled token was never
            # computed) in its prefix cache: the resent answer is the very ids it generated.
            computed = before["num_prompt_tokens"] + before["num_output_tokens"] - 1
            assert row["num_cached_tokens"] == 16 * (computed // 16)
            length, previous = row["num_prompt_tokens"] + turn.output_len, turn.request_id


def test_a_server_without_token_ids_ends_each_conversation_with_errors_that_say_why(monkeypatch):
    import asyncio
    import json

    import httpx

    from sim.server_run import _send_all

    def respond(request: httpx.Request) -> httpx.Response:
        chunks = [{"choices": [{"text": "a", "finish_reason": None}]},
                  {"choices": [{"text": "b", "finish_reason": "length"}]}]
        body = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})

    raw = config_with(workload__num_requests=2, workload__sessions__turns={"type": "constant", "value": 3},
                      workload__arrival={"type": "poisson", "rate": 100})
    specs = generate_requests(load_workload(raw), vocab_size=1000)
    transport = httpx.MockTransport(respond)
    original = httpx.AsyncClient.__init__
    monkeypatch.setattr(httpx.AsyncClient, "__init__",
                        lambda self, *args, **kwargs: original(self, *args, **dict(kwargs, transport=transport)))
    records = asyncio.run(_send_all(specs, "http://mock", "m", False, "mock"))
    assert len(records) == 6
    firsts = [record for record in records if record.turn == 1]
    assert all("returned no token ids" in record.error for record in firsts)
    later = [record for record in records if record.turn > 1]
    assert [record.turn for record in later] == [2, 3, 2, 3]
    assert all(record.finish_reason == "error" and "an earlier turn of its session failed" in record.error
               for record in later)
