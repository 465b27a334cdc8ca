"""Dashboards built from small synthetic runs: one run, several, a sweep, and a real run beside its
simulation. Each page must be self-contained and hold the figures its inputs call for."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from analysis import read_run, write_run
from analysis.dashboard import assemble_dashboard, build_dashboard, prepare_runs, write_run_dashboard
from analysis.dashboard.__main__ import main as dashboard_main
from analysis.dashboard.page import self_containment_problems
from analysis.dashboard.run_inputs import RUN_COLORS
from analysis.dashboard.synthetic_run import synthetic_run

ALWAYS_SHOWN = ("latency-cdf", "throughput-over-time", "scheduler-state", "kv-cache-usage", "prefix-cache-hit-rate",
                "request-timeline")
FIDELITY_FIGURES = ("fidelity-step-duration", "fidelity-error-histogram", "fidelity-request-latency")


def figure_ids(page: str) -> set[str]:
    return set(re.findall(r'<div id="([^"]+)" class="dashboard-figure"', page))


def build(tmp_path: Path, inputs, **options) -> str:
    out = build_dashboard(inputs, tmp_path / "report.html", **options)
    page = out.read_text(encoding="utf-8")
    assert self_containment_problems(page) == []
    return page


@pytest.fixture
def one_run(tmp_path: Path) -> Path:
    return synthetic_run(tmp_path / "one", num_requests=120, rate=30.0, name="chat")


def test_one_run_has_every_single_run_figure_and_tables(tmp_path: Path, one_run: Path) -> None:
    page = build(tmp_path, [one_run], title="My run")
    assert figure_ids(page) == set(ALWAYS_SHOWN)
    assert "<title>My run</title>" in page
    assert "latency (ms)" in page and "goodput (req/s)" in page  # the summary tables
    assert 'class="config"' in page and "max_num_seqs: 256" in page  # the configuration, readable
    assert "Latency distributions" in page and "KV-cache usage over time" in page

def test_every_axis_has_a_title_and_time_and_latency_axes_have_units(tmp_path: Path, one_run: Path) -> None:
    dashboard = assemble_dashboard(prepare_runs([one_run]))
    for figure in dashboard.figures:
        layout = figure.figure.layout
        assert layout.title.text, figure.figure_id
        axes = [name for name in layout if re.fullmatch(r"[xy]axis\d*", name) and layout[name].domain is not None
                or name in ("xaxis", "yaxis")]
        for name in axes:
            if layout[name].matches is not None:  # a shared time axis is titled once, under the last panel
                continue
            title = layout[name].title.text
            assert title, (figure.figure_id, name)
            if "time" in title or "latency" in title:
                assert "(s)" in title or "(ms)" in title, (figure.figure_id, name, title)


def test_single_path_and_loaded_run_are_accepted(tmp_path: Path, one_run: Path) -> None:
    from_path = build(tmp_path, one_run)
    from_run = build(tmp_path, [read_run(one_run)])
    assert figure_ids(from_path) == figure_ids(from_run)


def test_several_runs_are_overlaid_with_one_colour_each(tmp_path: Path) -> None:
    first = synthetic_run(tmp_path / "a", num_requests=80, rate=10.0, seed=1, name="fcfs",
                          config={"scheduler": {"policy": "fcfs"}, "model": "llama-3-8b"})
    second = synthetic_run(tmp_path / "b", num_requests=80, rate=20.0, seed=2, name="priority",
                           config={"scheduler": {"policy": "priority"}, "model": "qwen2-7b"})
    dashboard = assemble_dashboard(prepare_runs([first, second]))
    assert [run.color for run in dashboard.runs] == list(RUN_COLORS[:2])
    # Not a sweep (two fields differ) and no real run: only the overlaid figures.
    assert {figure.figure_id for figure in dashboard.figures} == set(ALWAYS_SHOWN)
    for figure in dashboard.figures:
        colours = {str(trace.line.color) for trace in figure.figure.data if getattr(trace, "line", None)} | \
            {str(trace.marker.color) for trace in figure.figure.data if getattr(trace, "marker", None)}
        for run in dashboard.runs:
            if figure.figure_id != "request-timeline":  # one run at a time, picked from a menu
                assert run.color in colours, (figure.figure_id, run.label)
    page = dashboard.html()
    assert "difference from fcfs" in page
    assert re.search(r"\([+-]\d+\.\d%\)", page)  # a relative difference in the summary table
    assert "Configuration fields that differ between runs" in page and "scheduler.policy" in page


def test_runs_differing_in_one_field_form_a_sweep(tmp_path: Path) -> None:
    points = [synthetic_run(tmp_path / f"rate={rate}", num_requests=80, rate=rate, seed=3, name="rate_sweep")
              for rate in (40.0, 5.0, 15.0)]
    dashboard = assemble_dashboard(prepare_runs(points))
    assert "latency-throughput" in {figure.figure_id for figure in dashboard.figures}
    # Same name everywhere: labels come from the directories.
    assert [run.label for run in dashboard.runs] == ["rate=40.0", "rate=5.0", "rate=15.0"]
    curve = next(figure for figure in dashboard.figures if figure.figure_id == "latency-throughput")
    p50 = curve.figure.data[0]
    assert list(p50.text) == ["rate=5.0", "rate=15.0", "rate=40.0"]  # drawn in sweep order
    assert "workload.arrival.rate" in dashboard.title
    page = dashboard.html()
    assert "SLO 500 ms" in page
    assert "Highest throughput meeting the SLO at p90" in page or "No run meets the SLO" in page


def test_a_sweep_directory_stands_for_its_points(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    rows = []
    for rate in (5.0, 10.0):
        point = synthetic_run(sweep_dir / f"rate={rate}", num_requests=60, rate=rate, seed=4, name="rate_sweep")
        # As sim.sweep writes it: the directory as given at the time, here relative and since moved.
        rows.append({"point": f"rate={rate}", "run_dir": f"old/place/rate={rate}"})
        assert point.is_dir()
    pd.DataFrame(rows).to_csv(sweep_dir / "sweep.csv", index=False)
    dashboard = assemble_dashboard(prepare_runs([sweep_dir]))
    assert [run.label for run in dashboard.runs] == ["rate=5.0", "rate=10.0"]
    assert "latency-throughput" in {figure.figure_id for figure in dashboard.figures}


def test_sim_beside_real_adds_fidelity_figures_and_error_table(tmp_path: Path) -> None:
    sim = synthetic_run(tmp_path / "sim", num_requests=100, rate=20.0, seed=5, name="chat-sim", mode="sim")
    real = synthetic_run(tmp_path / "real", num_requests=100, rate=20.0, seed=5, name="chat-real", mode="real",
                         step_noise=0.1)
    page = build(tmp_path, [real, sim])
    assert figure_ids(page) == set(ALWAYS_SHOWN) | set(FIDELITY_FIGURES)
    assert "Step duration: predicted by chat-sim vs measured on chat-real" in page  # steps joined one to one
    assert "ttft_ms.p90" in page and "relative error" in page  # compare_runs' table
    assert "Fidelity: chat-sim (sim) vs chat-real (real)" in page


def test_runs_of_different_request_streams_are_not_paired(tmp_path: Path) -> None:
    """A real run beside a simulation of another workload is two runs, not a fidelity comparison: pairing
    them would set unrelated requests that share an id against each other."""
    sim = synthetic_run(tmp_path / "sim", num_requests=100, rate=20.0, seed=5, name="other-sim", mode="sim")
    real = synthetic_run(tmp_path / "real", num_requests=100, rate=20.0, seed=9, name="chat-real", mode="real")
    page = build(tmp_path, [real, sim])
    assert figure_ids(page) == set(ALWAYS_SHOWN)
    assert "Fidelity:" not in page


def test_diverged_runs_compare_step_duration_distributions(tmp_path: Path) -> None:
    sim = synthetic_run(tmp_path / "sim", num_requests=60, rate=20.0, seed=6, name="sim", mode="replay")
    real_dir = synthetic_run(tmp_path / "real", num_requests=60, rate=20.0, seed=6, name="real", mode="real",
                             step_noise=0.1)
    real = read_run(real_dir)
    write_run(real_dir, real.requests, real.steps.iloc[:-7], real.summary)  # different scheduling: fewer steps
    page = build(tmp_path, [sim, real_dir])
    assert "Step duration distributions" in page
    assert "steps do not correspond one to one" in page


def test_write_run_dashboard_writes_into_the_run_directory(one_run: Path) -> None:
    path = write_run_dashboard(one_run)
    assert path == one_run / "dashboard.html"
    assert self_containment_problems(path.read_text(encoding="utf-8")) == []


def test_a_run_without_completed_requests_or_steps_still_builds(tmp_path: Path) -> None:
    requests = {
        "request_id": ["a", "b"], "arrival_time": [0.0, 0.5], "first_token_time": [float("nan")] * 2,
        "finish_time": [1.0, float("nan")], "num_prompt_tokens": [10, 10], "num_output_tokens": [0, 0],
        "num_cached_tokens": [0, 0], "num_preemptions": [0, 0], "finish_reason": ["abort", None],
        "token_times": [[], []],
    }
    steps = {name: [] for name in ("step", "start_time", "duration", "num_prefill_reqs", "num_decode_reqs",
                                   "num_scheduled_tokens", "num_prefill_tokens", "num_context_tokens", "num_running",
                                   "num_waiting", "kv_blocks_used", "num_preemptions", "prefix_hit_tokens")}
    run_dir = write_run(tmp_path / "empty", requests, steps, {"name": "empty", "mode": "real", "config": {}})
    page = build(tmp_path, [run_dir])
    assert figure_ids(page) == set(ALWAYS_SHOWN)
    assert "no engine steps recorded" in page


def test_run_names_are_escaped(tmp_path: Path) -> None:
    run_dir = synthetic_run(tmp_path / "odd", num_requests=30, name="</script><script>alert(1)</script>")
    page = build(tmp_path, [run_dir])
    assert "<script>alert(1)" not in page


def test_cli_writes_the_page_and_reports_bad_input(tmp_path: Path, one_run: Path, capsys) -> None:
    out = tmp_path / "cli.html"
    assert dashboard_main([str(one_run), "-o", str(out), "--title", "CLI"]) == 0
    assert "<title>CLI</title>" in out.read_text(encoding="utf-8")
    assert "6 figures" in capsys.readouterr().out
    assert dashboard_main([str(tmp_path / "missing"), "-o", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().err
    # An existing directory as the page to write: a one-line error naming the flag, exit 2.
    with pytest.raises(SystemExit) as exit_info:
        dashboard_main([str(one_run), "-o", str(tmp_path)])
    assert exit_info.value.code == 2
    assert f"-o/--out: '{tmp_path}' is a directory" in capsys.readouterr().err
    assert dashboard_main([str(out), "-o", str(tmp_path / "other.html")]) == 2  # a file given as a run
    assert "is not a directory" in capsys.readouterr().err


def test_png_export_is_skipped_with_a_message_without_kaleido(tmp_path: Path, one_run: Path, monkeypatch,
                                                              capsys) -> None:
    import analysis.dashboard.png_export as png_export

    monkeypatch.setattr(png_export, "kaleido_available", lambda: False)
    build_dashboard([one_run], tmp_path / "report.html", png_dir=tmp_path / "png")
    assert "PNG export skipped" in capsys.readouterr().err
    assert not (tmp_path / "png").exists()


def test_priority_runs_get_a_class_figure_side_by_side(tmp_path: Path, one_run: Path) -> None:
    from sim.run_pipeline import run_simulation
    from workloads import example_path, load_workload

    for policy in ("priority", "fcfs"):
        workload = load_workload(example_path("priority"), overrides=[
            "workload.num_requests=120", f"engine.scheduling_policy={policy}", f"name=priority-{policy}"])
        run_simulation(workload, tmp_path / policy)
    dashboard = assemble_dashboard(prepare_runs([tmp_path / "priority", tmp_path / "fcfs", one_run]))
    (figure,) = [figure for figure in dashboard.figures if figure.figure_id == "priority-classes"]
    bars = figure.figure.data
    # One bar trace per run that has classes (the chat run has none) and panel; three classes each.
    assert len(bars) == 2 * 4 and all(list(bar.x) == ["0", "1", "2"] for bar in bars)
    assert {bar.name for bar in bars} == {"priority-priority", "priority-fcfs"}
    summary = read_run(tmp_path / "priority").summary
    assert list(bars[0].y) == [summary["by_priority"][c]["ttft_ms"]["p50"] for c in ("0", "1", "2")]
    layout = figure.figure.layout
    assert all(layout[name].title.text for name in layout if re.fullmatch(r"[xy]axis\d*", name))
    assert "priority-classes" not in figure_ids(build(tmp_path, [one_run]))


def test_sessions_runs_get_a_figure_turn_by_turn(tmp_path: Path, one_run: Path) -> None:
    from sim.run_pipeline import run_simulation
    from workloads import example_path, load_workload

    for blocks in (27819, 3000):
        workload = load_workload(example_path("multi_turn"), overrides=[
            "sweep=null", "workload.num_requests=80", f"engine.num_gpu_blocks={blocks}", f"name=turns-{blocks}"])
        run_simulation(workload, tmp_path / str(blocks))
    dashboard = assemble_dashboard(prepare_runs([tmp_path / "27819", tmp_path / "3000", one_run]))
    (figure,) = [figure for figure in dashboard.figures if figure.figure_id == "session-turns"]
    # Per sessions run (the chat run has none): its cached share, then its TTFT p50 and p90, over the turns.
    traces = figure.figure.data
    assert [trace.name for trace in traces] == ["turns-27819", "turns-27819 p50", "turns-27819 p90",
                                                "turns-3000", "turns-3000 p50", "turns-3000 p90"]
    by_turn = read_run(tmp_path / "3000").summary["sessions"]["by_turn"]
    assert list(traces[3].x) == [str(row["turn"]) for row in by_turn]
    assert list(traces[3].y) == [100 * row["cached_fraction"] for row in by_turn]
    assert traces[0].y[1] > traces[3].y[1]  # the larger pool holds more of the history
    layout = figure.figure.layout
    assert all(layout[name].title.text for name in layout if re.fullmatch(r"[xy]axis\d*", name))
    assert "session-turns" not in figure_ids(build(tmp_path, [one_run]))


def test_a_concurrency_sweep_draws_throughput_per_gpu_against_interactivity(tmp_path: Path) -> None:
    from sim.run import main as sim_run_main

    assert sim_run_main(["concurrency_sweep", "--set", "workload.num_requests=24", "--set",
                         "sweep={workload.max_concurrency: [1, 8]}", "--set", "engine.tensor_parallel_size=2",
                         "--out", str(tmp_path / "sweep"), "--no-progress", "--no-dashboard", "--quiet"]) == 0
    dashboard = assemble_dashboard(prepare_runs([tmp_path / "sweep"]))
    (figure,) = [figure for figure in dashboard.figures if figure.figure_id == "throughput-interactivity"]
    (trace,) = figure.figure.data
    summaries = [read_run(tmp_path / "sweep" / f"max_concurrency={limit}").summary for limit in (1, 8)]
    assert list(trace.x) == pytest.approx([1000 / summary["tpot_ms"]["p50"] for summary in summaries])
    # Two GPUs per engine (tensor parallel): the throughput each produces is half the engine's.
    assert list(trace.y) == pytest.approx([summary["output_token_throughput"] / 2 for summary in summaries])
    assert trace.x[0] > trace.x[1] and trace.y[0] < trace.y[1]  # more clients: each slower, the GPU busier
    assert "throughput-interactivity" not in figure_ids(build(tmp_path, [synthetic_run(tmp_path / "one")]))
