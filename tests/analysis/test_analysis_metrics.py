import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.metrics import compute_summary, inter_token_latencies, latency_stats, request_latencies
from analysis.trace_schema import REQUIRED_REQUEST_COLUMNS, requests_table, steps_table

DESIGN_SUMMARY_KEYS = {
    "name", "mode", "config", "num_requests", "num_finished", "duration_s", "request_throughput",
    "output_token_throughput", "goodput", "num_preemptions", "prefix_cache_hit_rate", "kv_usage_mean",
    "kv_usage_max", "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms",
}
LATENCY_KEYS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms")


def summarize(request_columns, step_columns, **options):
    requests = requests_table(request_columns).to_pandas()
    steps = steps_table(step_columns).to_pandas()
    options.setdefault("name", "hand")
    options.setdefault("mode", "sim")
    options.setdefault("config", {"seed": 0})
    return compute_summary(requests, steps, **options)


def assert_stats(stats, count, mean, p50, p90, p99):
    assert stats["count"] == count
    assert stats["mean"] == pytest.approx(mean)
    assert stats["p50"] == pytest.approx(p50)
    assert stats["p90"] == pytest.approx(p90)
    assert stats["p99"] == pytest.approx(p99)


def test_hand_built_latencies(request_columns, step_columns):
    summary = summarize(request_columns, step_columns)
    # Percentiles by linear interpolation: p90 of 3 sorted values sits 80% of the way from the 2nd to the 3rd.
    assert_stats(summary["ttft_ms"], 3, 400.0, 400.0, 480.0, 498.0)
    assert_stats(summary["tpot_ms"], 2, 350.0, 350.0, 470.0, 497.0)
    assert_stats(summary["itl_ms"], 5, 320.0, 200.0, 500.0, 500.0)
    assert_stats(summary["e2e_ms"], 3, 2800.0 / 3, 1000.0, 1400.0, 1490.0)
    assert_stats(summary["queue_ms"], 3, 100.0, 100.0, 180.0, 198.0)


def test_hand_built_counts_and_rates(request_columns, step_columns):
    summary = summarize(request_columns, step_columns)
    assert DESIGN_SUMMARY_KEYS <= set(summary)
    assert summary["name"] == "hand" and summary["mode"] == "sim" and summary["config"] == {"seed": 0}
    assert summary["num_requests"] == 4
    assert summary["num_finished"] == 3
    assert summary["num_aborted"] == 1 and summary["num_ignored"] == 0
    assert summary["duration_s"] == pytest.approx(3.0)
    assert summary["request_throughput"] == pytest.approx(1.0)
    assert summary["output_token_throughput"] == pytest.approx(8 / 3)
    assert summary["goodput"] == pytest.approx(1.0)  # no SLO: every completed request is good
    assert summary["slo_attainment"] == pytest.approx(1.0)
    assert summary["num_preemptions"] == 1
    assert summary["prefix_cache_hit_rate"] == pytest.approx(0.4)
    assert summary["kv_usage_mean"] == pytest.approx(1.1 / 3)
    assert summary["kv_usage_max"] == pytest.approx(0.6)
    json.dumps(summary, allow_nan=False)


def test_goodput_counts_requests_meeting_every_slo(request_columns, step_columns):
    # r0 misses TTFT (500 > 450); r1 and r2 pass; r2's single token counts as TPOT 0.
    summary = summarize(request_columns, step_columns, slo={"ttft_ms": 450, "tpot_ms": 300})
    assert summary["goodput"] == pytest.approx(2 / 3)
    assert summary["slo_attainment"] == pytest.approx(2 / 3)
    assert summary["slo"] == {"ttft_ms": 450.0, "tpot_ms": 300.0}
    # Adding an E2E target of 900 ms also fails r1 (1000 ms): only r2 is left.
    summary = summarize(request_columns, step_columns, slo={"ttft_ms": 450, "tpot_ms": 300, "e2e_ms": 900})
    assert summary["goodput"] == pytest.approx(1 / 3)
    assert summary["request_throughput"] == pytest.approx(1.0)


def test_explicit_duration_overrides_the_trace(request_columns, step_columns):
    summary = summarize(request_columns, step_columns, duration_s=6.0)
    assert summary["duration_s"] == 6.0
    assert summary["request_throughput"] == pytest.approx(0.5)
    assert summary["output_token_throughput"] == pytest.approx(8 / 6)


def test_bad_options_are_rejected(request_columns, step_columns):
    with pytest.raises(ValueError, match="mode"):
        summarize(request_columns, step_columns, mode="simulated")
    with pytest.raises(ValueError, match="itl_ms"):
        summarize(request_columns, step_columns, slo={"itl_ms": 50})
    with pytest.raises(ValueError, match="ttft_ms"):
        summarize(request_columns, step_columns, slo={"ttft_ms": -1})


def test_missing_column_is_named(request_columns, step_columns):
    requests = requests_table(request_columns).to_pandas().drop(columns=["first_token_time"])
    with pytest.raises(ValueError, match="first_token_time"):
        compute_summary(requests, None, name="x", mode="sim", config={}, slo=None)


def test_empty_run_gives_null_stats():
    empty = {name: [] for name in REQUIRED_REQUEST_COLUMNS}
    requests = requests_table(empty).to_pandas()
    summary = compute_summary(requests, None, name="empty", mode="real", config={}, slo=None)
    assert summary["num_requests"] == 0 and summary["num_finished"] == 0
    assert summary["duration_s"] == 0.0
    assert summary["request_throughput"] == 0.0 and summary["goodput"] == 0.0
    assert summary["slo_attainment"] is None
    assert summary["kv_usage_mean"] is None and summary["kv_usage_max"] is None
    assert summary["prefix_cache_hit_rate"] == 0.0
    for key in LATENCY_KEYS:
        assert summary[key] == {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None}
    json.dumps(summary, allow_nan=False)


def test_all_aborted_run_does_not_crash(request_columns, step_columns):
    request_columns["finish_reason"] = ["abort", "abort", "ignored", "abort"]
    summary = summarize(request_columns, step_columns, slo={"ttft_ms": 100})
    assert summary["num_finished"] == 0
    assert summary["num_aborted"] == 3 and summary["num_ignored"] == 1
    assert summary["request_throughput"] == 0.0 and summary["goodput"] == 0.0
    assert summary["slo_attainment"] is None
    assert all(summary[key]["count"] == 0 for key in LATENCY_KEYS)
    # Step metrics do not depend on how requests ended.
    assert summary["prefix_cache_hit_rate"] == pytest.approx(0.4)


def test_the_first_ignored_requests_are_named_with_their_reason(request_columns, step_columns):
    assert "ignored_examples" not in summarize(request_columns, step_columns)
    request_columns["finish_reason"] = ["ignored", "length", "ignored", "ignored"]
    request_columns["status_message"] = ["too long a", None, "too long c", "too long d"]
    request_columns["arrival_time"] = [0.3, 0.0, 0.1, 0.2]
    summary = summarize(request_columns, step_columns)
    reasons = [(example["request_id"], example["reason"]) for example in summary["ignored_examples"]]
    ids = request_columns["request_id"]
    assert reasons == [(ids[2], "too long c"), (ids[3], "too long d"), (ids[0], "too long a")]


def test_the_first_errored_requests_are_named_with_the_servers_message(request_columns, step_columns):
    """A server run's errored requests carry the server's message (sim/server_run.py), like ignored ones."""
    request_columns["finish_reason"] = ["error", "length", "error", "length"]
    request_columns["status_message"] = ["HTTP 400: prompt has 5000 tokens", None, "HTTP 400: later", None]
    summary = summarize(request_columns, step_columns)
    assert "ignored_examples" not in summary
    ids = request_columns["request_id"]
    assert summary["errored_examples"] == [{"request_id": ids[0], "reason": "HTTP 400: prompt has 5000 tokens"},
                                           {"request_id": ids[2], "reason": "HTTP 400: later"}]


def test_unfinished_requests_are_counted_apart(request_columns, step_columns):
    request_columns["finish_reason"][3] = None
    request_columns["finish_time"][3] = float("nan")
    summary = summarize(request_columns, step_columns)
    assert summary["num_unfinished"] == 1 and summary["num_finished"] == 3
    assert summary["duration_s"] == pytest.approx(2.3)


def test_arrow_backed_frames_give_the_same_summary(request_columns, step_columns):
    requests = requests_table(request_columns).to_pandas(types_mapper=pd.ArrowDtype)
    steps = steps_table(step_columns).to_pandas(types_mapper=pd.ArrowDtype)
    summary = compute_summary(requests, steps, name="hand", mode="sim", config={"seed": 0}, slo=None)
    assert summary == summarize(request_columns, step_columns)


def test_request_latencies_table(request_columns):
    latencies = request_latencies(requests_table(request_columns).to_pandas())
    assert list(latencies["request_id"]) == ["r0", "r1", "r2"]
    assert np.isnan(latencies["tpot_ms"].iloc[2])
    assert latencies["ttft_ms"].to_numpy() == pytest.approx([500.0, 400.0, 300.0])


def test_latency_stats_ignore_non_finite_values():
    stats = latency_stats([0.001, float("nan"), 0.003, float("inf")])
    assert stats["count"] == 2 and stats["mean"] == pytest.approx(2.0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.floats(0, 100, allow_nan=False), max_size=6), max_size=8))
def test_pooled_itl_equals_per_request_gaps(rows):
    token_times = [sorted(row) for row in rows]
    frame = pd.DataFrame(
        {
            "request_id": [str(index) for index in range(len(rows))],
            "arrival_time": 0.0,
            "first_token_time": 0.0,
            "finish_time": 100.0,
            "num_prompt_tokens": 1,
            "num_output_tokens": [len(row) for row in rows],
            "num_cached_tokens": 0,
            "num_preemptions": 0,
            "finish_reason": "stop",
            "token_times": pd.Series([np.asarray(row) for row in token_times], dtype=object),
        }
    )
    # Equal times are tokens delivered together: one gap per delivery, none inside it.
    expected = [later - earlier for row in token_times for earlier, later in zip(row, row[1:]) if later > earlier]
    assert inter_token_latencies(frame).tolist() == pytest.approx(expected)


def test_tokens_streamed_in_one_chunk_count_one_inter_token_latency(request_columns, step_columns):
    """A server that merges a lagging client's deltas sends several tokens in one chunk, which the client
    stamps with the chunk's arrival. vLLM's benchmark records one ITL per chunk: the zero gap inside a
    chunk is no latency (such gaps pulled ITL p90 13% below vLLM's figure in a loaded server run)."""
    request_columns["token_times"][0] = [0.5, 1.0, 1.0, 1.5]  # r0's 2nd and 3rd tokens came in one chunk
    request_columns["num_output_tokens"][0] = 4
    summary = summarize(request_columns, step_columns)
    assert_stats(summary["itl_ms"], 5, 320.0, 200.0, 500.0, 500.0)  # the gaps of the hand-built run
    # TPOT still divides by every token after the first: r0 (1.5 - 0.5) / 3, r1 200.
    assert_stats(summary["tpot_ms"], 2, (1000.0 / 3 + 200.0) / 2, (1000.0 / 3 + 200.0) / 2,
                 200.0 + 0.9 * (1000.0 / 3 - 200.0), 200.0 + 0.99 * (1000.0 / 3 - 200.0))


def synthetic_run(num_requests=10_000, tokens_per_request=200, seed=0):
    """A large run built with numpy only, as the simulator would build it."""
    generator = np.random.default_rng(seed)
    arrival = np.cumsum(generator.exponential(0.01, num_requests))
    scheduled = arrival + generator.exponential(0.005, num_requests)
    num_output = generator.integers(tokens_per_request // 2, tokens_per_request * 3 // 2, num_requests)
    first_token = scheduled + generator.exponential(0.05, num_requests)
    gaps = generator.exponential(0.02, int(num_output.sum()))
    offsets = np.concatenate([[0], np.cumsum(num_output)])
    token_times = [
        first_token[index] + np.concatenate([[0.0], np.cumsum(gaps[offsets[index] + 1 : offsets[index + 1]])])
        for index in range(num_requests)
    ]
    requests = {
        "request_id": [f"request-{index}" for index in range(num_requests)],
        "arrival_time": arrival,
        "scheduled_time": scheduled,
        "first_token_time": first_token,
        "finish_time": np.array([times[-1] for times in token_times]),
        "num_prompt_tokens": generator.integers(50, 1000, num_requests),
        "num_output_tokens": num_output,
        "num_cached_tokens": np.zeros(num_requests, dtype=np.int64),
        "num_preemptions": np.zeros(num_requests, dtype=np.int64),
        "finish_reason": np.where(generator.random(num_requests) < 0.9, "stop", "length").tolist(),
        "token_times": token_times,
    }
    num_steps = 100_000
    durations = generator.uniform(0.005, 0.03, num_steps)
    steps = {
        name: generator.integers(0, 100, num_steps)
        for name in ("num_prefill_reqs", "num_decode_reqs", "num_scheduled_tokens", "num_prefill_tokens",
                     "num_context_tokens", "num_running", "num_waiting", "kv_blocks_used", "num_preemptions",
                     "prefix_hit_tokens")
    }
    steps.update(
        step=np.arange(num_steps),
        start_time=np.concatenate([[0.0], np.cumsum(durations)[:-1]]),
        duration=durations,
        kv_usage=generator.random(num_steps),
        prefix_query_tokens=steps["prefix_hit_tokens"] + 10,
    )
    return requests, steps


def test_large_run_summarizes_and_round_trips(tmp_path):
    from analysis.run_dir import read_run, write_run

    requests_columns, steps_columns = synthetic_run()
    requests = requests_table(requests_columns).to_pandas()
    steps = steps_table(steps_columns).to_pandas()
    summary = compute_summary(requests, steps, name="large", mode="sim", config={}, slo={"ttft_ms": 100})
    write_run(tmp_path / "large", requests_columns, steps_columns, summary)
    run = read_run(tmp_path / "large")
    assert summary["num_finished"] == 10_000
    assert summary["itl_ms"]["count"] == int(requests["num_output_tokens"].sum()) - 10_000
    assert len(run.steps) == 100_000
    assert run.summary["num_finished"] == 10_000


def test_latency_by_priority_class(request_columns, step_columns):
    # r0, r1 (finished) and r3 (aborted) are class 0; r2 is class 1.
    summary = summarize(request_columns, step_columns, slo={"ttft_ms": 450})
    classes = summary["by_priority"]
    assert list(classes) == ["0", "1"]
    assert (classes["0"]["num_requests"], classes["0"]["num_finished"]) == (3, 2)
    assert_stats(classes["0"]["ttft_ms"], 2, 450.0, 450.0, 490.0, 499.0)
    assert classes["0"]["slo_attainment"] == pytest.approx(0.5)  # r0's 500 ms misses 450
    assert_stats(classes["1"]["e2e_ms"], 1, 300.0, 300.0, 300.0, 300.0)
    assert classes["1"]["tpot_ms"]["count"] == 0 and classes["1"]["slo_attainment"] == 1.0
    json.dumps(summary, allow_nan=False)
    # One class only: nothing to set side by side.
    request_columns["priority"] = [0, 0, 0, 0]
    assert "by_priority" not in summarize(request_columns, step_columns)


def test_the_report_prints_the_priority_classes(request_columns, step_columns):
    from analysis.report import format_summary

    text = format_summary(summarize(request_columns, step_columns))
    assert "by priority class" in text and "2/3" in text
