"""Metrics by request class (summary.json's by_class), each class judged by its own SLO, on a hand-built run.

    request  class  arrival first_token finish  tokens  token_times              reason
    c0       chat   0.0     0.1         0.5     5       0.1 0.2 0.3 0.4 0.5      length
    c1       chat   1.0     1.4         2.0     4       1.4 1.6 1.8 2.0          length
    b0       batch  0.5     1.5         5.5     3       1.5 3.5 5.5              length
    b1       batch  2.0     never       3.0     0       -                        abort

Duration 0.0 -> 5.5 s. SLOs: the top-level (chat's) TTFT <= 200 ms; batch's own E2E <= 6000 ms.
chat: TTFT 100, 400 ms (one meets); TPOT 100, 200 ms; ITL gaps 100 x4, 200 x3; E2E 500, 1000 ms.
batch: one finished, TTFT 1000, TPOT 2000, E2E 5000 ms (meets its own SLO, would fail chat's).
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from analysis import compute_summary, read_run, requests_table, write_run
from analysis.dashboard import assemble_dashboard, prepare_runs
from analysis.report import format_comparison, format_summary
from sim.sweep import SweepPointResult, write_sweep_table

NAN = math.nan
TOP_SLO = {"ttft_ms": 200.0}
CLASS_SLOS = {"chat": {"ttft_ms": 200.0}, "batch": {"e2e_ms": 6000.0}}
SHIPPED_RUN = Path(__file__).resolve().parents[2] / "sim" / "data" / "runs" / "cpu-small-float32" / "cpu-chat"


def class_requests() -> pd.DataFrame:
    return requests_table({
        "request_id": ["c0", "b0", "c1", "b1"],
        "arrival_time": [0.0, 0.5, 1.0, 2.0],
        "scheduled_time": [0.05, 0.6, 1.3, NAN],
        "first_token_time": [0.1, 1.5, 1.4, NAN],
        "finish_time": [0.5, 5.5, 2.0, 3.0],
        "num_prompt_tokens": [10, 500, 20, 400],
        "num_output_tokens": [5, 3, 4, 0],
        "num_cached_tokens": [0, 0, 0, 0],
        "num_preemptions": [0, 0, 0, 0],
        "finish_reason": ["length", "length", "length", "abort"],
        "priority": [0, 1, 0, 1],
        "request_class": ["chat", "batch", "chat", "batch"],
        "token_times": [[0.1, 0.2, 0.3, 0.4, 0.5], [1.5, 3.5, 5.5], [1.4, 1.6, 1.8, 2.0], []],
    }).to_pandas()


def summarize(requests: pd.DataFrame, class_slos=CLASS_SLOS, name: str = "classes") -> dict:
    return compute_summary(requests, None, name=name, mode="sim", config={}, slo=TOP_SLO, class_slos=class_slos)


def test_by_class_matches_the_hand_computed_figures():
    summary = summarize(class_requests())
    assert list(summary["by_class"]) == ["chat", "batch"]  # the workload's order
    chat, batch = summary["by_class"]["chat"], summary["by_class"]["batch"]
    assert (chat["num_requests"], chat["num_finished"], batch["num_requests"], batch["num_finished"]) == (2, 2, 2, 1)
    assert chat["request_throughput"] == pytest.approx(2 / 5.5)
    assert chat["output_token_throughput"] == pytest.approx(9 / 5.5)
    assert chat["goodput"] == pytest.approx(1 / 5.5) and chat["slo_attainment"] == pytest.approx(0.5)
    assert chat["slo"] == {"ttft_ms": 200.0} and batch["slo"] == {"e2e_ms": 6000.0}
    assert chat["ttft_ms"]["p50"] == pytest.approx(250.0) and chat["ttft_ms"]["p90"] == pytest.approx(370.0)
    assert chat["tpot_ms"]["mean"] == pytest.approx(150.0)
    assert chat["itl_ms"]["count"] == 7 and chat["itl_ms"]["mean"] == pytest.approx(1000.0 / 7)
    assert chat["itl_ms"]["p50"] == pytest.approx(100.0)
    assert chat["e2e_ms"]["p99"] == pytest.approx(500 + 0.99 * 500)
    assert batch["ttft_ms"]["p50"] == pytest.approx(1000.0) and batch["tpot_ms"]["p50"] == pytest.approx(2000.0)
    assert batch["e2e_ms"]["p50"] == pytest.approx(5000.0) and batch["slo_attainment"] == 1.0
    assert batch["goodput"] == pytest.approx(1 / 5.5)
    # The classes add up to the run.
    assert chat["request_throughput"] + batch["request_throughput"] == pytest.approx(summary["request_throughput"])


def test_the_run_judges_every_request_by_its_own_class_slo():
    summary = summarize(class_requests())
    # c0 meets chat's TTFT, c1 misses it, b0 meets batch's E2E (its TTFT of 1000 ms would miss chat's).
    assert summary["slo_attainment"] == pytest.approx(2 / 3) and summary["goodput"] == pytest.approx(2 / 5.5)
    assert summary["slo"] == TOP_SLO
    # The same requests under the top-level SLO alone: b0 fails it.
    alone = summarize(class_requests(), class_slos=None)
    assert alone["slo_attainment"] == pytest.approx(1 / 3)
    # The priority classes (one per request class here) are judged the same way.
    assert summary["by_priority"]["1"]["slo_attainment"] == 1.0


def test_one_class_or_an_old_trace_has_no_by_class():
    requests = class_requests()
    single = requests.assign(request_class="default")
    assert "by_class" not in summarize(single, class_slos={"default": TOP_SLO})
    old = requests.drop(columns=["request_class"])
    summary = summarize(old, class_slos=None)
    assert "by_class" not in summary and summary["slo_attainment"] == pytest.approx(1 / 3)


def test_a_declared_class_without_requests_still_gets_a_row():
    summary = summarize(class_requests(), class_slos={**CLASS_SLOS, "late": {"ttft_ms": 1.0}})
    assert summary["by_class"]["late"]["num_requests"] == 0 and summary["by_class"]["late"]["slo_attainment"] is None


def test_the_trace_stores_the_class_and_defaults_it():
    table = requests_table({"request_id": ["a"], "arrival_time": [0.0], "first_token_time": [0.1],
                            "finish_time": [0.2], "num_prompt_tokens": [1], "num_output_tokens": [1],
                            "num_cached_tokens": [0], "num_preemptions": [0], "finish_reason": ["length"],
                            "token_times": [[0.1]]})
    assert table.column("request_class").to_pylist() == ["default"]
    assert list(requests_table(class_requests()).column("request_class").to_pylist()) == [
        "chat", "batch", "chat", "batch"]


def test_a_run_recorded_before_classes_loads_and_reports(tmp_path):
    # A shipped real run, recorded before the column existed.
    assert "request_class" not in pq.read_schema(SHIPPED_RUN / "requests.parquet").names
    run = read_run(SHIPPED_RUN)
    assert set(run.requests["request_class"]) == {"default"}
    assert "by request class" not in format_summary(run.summary)
    summary = compute_summary(run.requests, run.steps, name="old", mode="real", config={},
                              slo=run.summary.get("slo"))
    assert "by_class" not in summary and summary["num_finished"] == run.summary["num_finished"]
    shutil.copytree(SHIPPED_RUN, tmp_path / "old")
    dashboard = assemble_dashboard(prepare_runs([tmp_path / "old"]))
    assert "classes" not in [section.section_id for section in dashboard.sections]


def test_the_report_prints_a_class_table_and_per_class_comparison_rows():
    summary = summarize(class_requests())
    text = format_summary(summary)
    assert "by request class" in text and "SLOs: chat ttft<=200ms; batch e2e<=6000ms" in text
    chat_row = next(line for line in text.splitlines() if line.startswith("│ chat"))
    assert "2/2" in chat_row and "50.0%" in chat_row and "370.0" in chat_row
    comparison = format_comparison([summary, summarize(class_requests().assign(request_class="default"),
                                                       class_slos={"default": TOP_SLO})], ["two", "one"], width=160)
    assert "chat: SLO attainment" in comparison and "batch: E2E p90 (ms)" in comparison
    batch_row = next(line for line in comparison.splitlines() if "batch: SLO attainment" in line)
    assert "100.0%" in batch_row and batch_row.rstrip("│ ").endswith("-")  # the run of one class has no batch


def test_sweep_csv_gains_per_class_columns(tmp_path):
    summary = summarize(class_requests())
    table = write_sweep_table([SweepPointResult("rate=1", summary, tmp_path / "a")], tmp_path / "sweep.csv")
    row = table.iloc[0]
    assert row["chat.slo_attainment"] == pytest.approx(0.5) and row["batch.slo_attainment"] == 1.0
    assert row["chat.ttft_ms_p90"] == pytest.approx(370.0) and row["batch.e2e_ms_p90"] == pytest.approx(5000.0)


def test_the_dashboard_draws_each_class_and_judges_goodput_by_its_slo(tmp_path):
    requests = class_requests()
    summary = summarize(requests)
    write_run(tmp_path / "classes", requests, {"step": [], "start_time": [], "duration": [], "num_prefill_reqs": [],
                                               "num_decode_reqs": [], "num_scheduled_tokens": [],
                                               "num_prefill_tokens": [], "num_context_tokens": [], "num_running": [],
                                               "num_waiting": [], "kv_blocks_used": [], "num_preemptions": [],
                                               "prefix_hit_tokens": []}, summary)
    dashboard = assemble_dashboard(prepare_runs([tmp_path / "classes"]))
    (section,) = [section for section in dashboard.sections if section.section_id == "classes"]
    distributions, bars = section.figures
    assert [trace.name for trace in distributions.figure.data] == ["chat", "batch", "chat", "batch"]
    assert list(distributions.figure.data[1].x) == [1000.0]  # batch's TTFT, its one finished request
    attainment = bars.figure.data[0]
    assert list(attainment.x) == ["chat", "batch"] and list(attainment.y) == [50.0, 100.0]
    # Goodput over time counts b0 as good (its own SLO), which the top-level SLO would not.
    run = dashboard.runs[0]
    assert list(run.meets_slo) == [True, True, False]  # latencies' rows: c0, b0, c1
