"""``sim.server_run.run_against_server``: a small workload over HTTP -> a run directory like any other."""

import math

import pytest

from analysis import read_run
from sim.server_run import _Record, run_against_server, served_prefix_hit_rate
from workloads import generate_requests, load_workload_text

WORKLOAD = """
name: served-small
seed: 3
model: servesim-tiny
hardware: cpu
dtype: float32
engine: {block_size: 16, num_gpu_blocks: 1024, max_num_seqs: 64, max_model_len: 512}
workload:
  num_requests: 20
  arrival: {type: poisson, rate: 40}
  prompt_len: {type: uniform, min: 4, max: 40}
  output_len: {type: uniform, min: 2, max: 12}
  shared_prefix: {num_groups: 2, prefix_len: 16, fraction: 0.5}
"""


def test_run_against_server_writes_a_run_directory(server, tmp_path):
    workload = load_workload_text(WORKLOAD)
    summary = run_against_server(workload, server.url, tmp_path / "run", progress=False)
    specs = generate_requests(workload, vocab_size=512, reserved_token_ids=[0, 1, 2, 3])

    assert summary["mode"] == "real" and summary["name"] == "served-small"
    assert summary["num_requests"] == 20 and summary["num_finished"] == 20 and summary["num_request_errors"] == 0
    assert summary["total_output_tokens"] == sum(spec.output_len for spec in specs)
    assert summary["total_prompt_tokens"] == sum(len(spec.prompt_token_ids) for spec in specs)
    assert summary["config"]["executor"] == {"kind": "server", "url": server.url, "model": "tiny",
                                             "max_model_len": 512}
    assert summary["config"]["vocab_size"] == 512 and summary["config"]["reserved_token_ids"] == [0, 1, 2, 3]
    assert summary["ttft_ms"]["p50"] > 0 and summary["e2e_ms"]["p99"] >= summary["ttft_ms"]["p99"]

    run = read_run(tmp_path / "run")
    assert run.summary["num_finished"] == 20 and len(run.steps) == 0
    requests = run.requests.set_index("request_id")
    for spec in specs:
        row = requests.loc[spec.request_id]
        assert row["finish_reason"] == "length" and row["num_output_tokens"] == spec.output_len
        assert row["num_prompt_tokens"] == len(spec.prompt_token_ids)
        times = list(row["token_times"])
        assert len(times) == spec.output_len and times == sorted(times)
        assert math.isclose(times[0], row["first_token_time"])
        assert row["arrival_time"] <= row["first_token_time"] <= row["finish_time"]
        # Sent at its arrival time, never before it (how late depends on how busy the machine is: a run beside
        # another CPU-bound process sent one 0.83 s late, so lateness is not asserted).
        assert row["arrival_time"] >= spec.arrival_time - 1e-3
    # ...and in the workload's order.
    sent = requests.loc[[spec.request_id for spec in sorted(specs, key=lambda spec: spec.arrival_time)], "arrival_time"]
    assert sent.is_monotonic_increasing
    # Requests of one shared-prefix group find the group's first full block cached (after the first one).
    assert requests["num_cached_tokens"].sum() > 0
    # The hit rate is the server's count of cached prompt tokens: the client sees no engine step to read it
    # from (it once read 0.0 from the empty step table).
    hit_rate = requests["num_cached_tokens"].sum() / requests["num_prompt_tokens"].sum()
    assert summary["prefix_cache_hit_rate"] == run.summary["prefix_cache_hit_rate"] == pytest.approx(hit_rate)


def test_a_server_that_does_not_count_cached_tokens_gives_no_hit_rate():
    """Unknown, not 0: vLLM leaves prompt_tokens_details out of usage unless asked to send it."""
    counted = [_Record("a", 0.0, 100, num_cached_tokens=64, cached_tokens_reported=True),
               _Record("b", 0.1, 60, num_cached_tokens=0, cached_tokens_reported=True)]
    assert served_prefix_hit_rate(counted) == pytest.approx(64 / 160)
    assert served_prefix_hit_rate([_Record("c", 0.0, 100)]) is None
    assert served_prefix_hit_rate([]) is None


def test_a_server_run_records_each_request_class(server, tmp_path):
    """The class travels with the request to the client's record, so a server run reports by class too."""
    workload = load_workload_text(WORKLOAD + """  class_name: chat
  classes:
    - {name: batch, num_requests: 6, start_s: 0.05, arrival: {type: poisson, rate: 40},
       prompt_len: {type: constant, value: 64}, output_len: {type: constant, value: 8}, slo: {e2e_ms: 60000}}
slo: {ttft_ms: 5000}
""")
    summary = run_against_server(workload, server.url, tmp_path / "run", progress=False)
    specs = generate_requests(workload, vocab_size=512, reserved_token_ids=[0, 1, 2, 3])
    requests = read_run(tmp_path / "run").requests.set_index("request_id")
    assert {spec.request_id: spec.request_class for spec in specs} == requests["request_class"].to_dict()
    assert summary["by_class"]["batch"]["num_finished"] == 6 and summary["by_class"]["chat"]["num_finished"] == 20
    assert summary["by_class"]["batch"]["slo"] == {"e2e_ms": 60000.0}
