"""Which figures a dashboard shows, and writing it: `build_dashboard` and `write_run_dashboard`.

The page adapts to what it is given:
- always: the runs, a summary table, latency CDFs, throughput and goodput over time, scheduler state
  per step, KV-cache usage with preemptions, prefix-cache hit rate, a per-request timeline and the
  configuration; with several runs every figure overlays them, one colour per run throughout;
- runs that form a sweep: the latency-throughput curve with the SLO and the best point meeting it;
- runs of several request classes (``workload.classes``): each class's latency distributions, SLO
  attainment under its own SLO, TTFT and E2E;
- cluster runs: the replicas side by side (requests routed, busy time, hits, TTFT), and the scheduler
  and KV-cache figures summed over the replicas;
- a real run beside a simulated or replayed one: predicted vs measured step durations, error
  distributions, per-request latency sim vs real, and the metric-by-metric error table.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from analysis.dashboard import fidelity_figures, sweep_figures
from analysis.dashboard.class_figures import class_bar_figure, class_distribution_figure
from analysis.dashboard.figure_style import DashboardFigure
from analysis.dashboard.interactivity_figure import interactivity_figure
from analysis.dashboard.html_tables import config_html, fidelity_table_html, run_list_html, summary_table_html
from analysis.dashboard.latency_figures import latency_cdf_figure
from analysis.dashboard.priority_figures import priority_class_figure
from analysis.dashboard.page import Section, render_page
from analysis.dashboard.rate_figures import prefix_hit_figure, throughput_figure
from analysis.dashboard.autoscaling_figure import autoscaling_figure
from analysis.dashboard.multimodal_figure import multimodal_figure
from analysis.dashboard.replica_figures import replica_figure
from analysis.dashboard.session_figure import session_turns_figure
from analysis.dashboard.ttft_parts_figure import ttft_parts_figure
from analysis.dashboard.run_inputs import DashboardRun, RunInput, expand_inputs, label_runs
from analysis.dashboard.step_figures import kv_usage_figure, scheduler_state_figure
from analysis.dashboard.timeline_figure import timeline_figure
from analysis.run_dir import Run

DASHBOARD_FILE = "dashboard.html"


@dataclass
class Dashboard:
    """A dashboard ready to write: its title, subtitle and sections."""

    title: str
    subtitle: str
    sections: list[Section]
    runs: list[DashboardRun]

    @property
    def figures(self) -> list[DashboardFigure]:
        return [figure for section in self.sections for figure in section.figures]

    def html(self, browser_probe: bool = False) -> str:
        return render_page(self.title, self.subtitle, self.sections, browser_probe=browser_probe)


def prepare_runs(inputs: RunInput | Iterable[RunInput]) -> list[DashboardRun]:
    """Load and label the runs (a single run directory or Run is accepted as well as a list)."""
    if isinstance(inputs, (str, Path, Run)):
        inputs = [inputs]
    return label_runs(expand_inputs(inputs))


def assemble_dashboard(runs: list[DashboardRun], title: str | None = None) -> Dashboard:
    sweep = sweep_figures.detect_sweep(runs)
    pairs = fidelity_figures.find_pairs(runs)
    sections = [Section("overview", "Runs and summary", [run_list_html(runs), summary_table_html(runs)])]
    if pairs:
        fidelity = Section("fidelity", "Simulation vs real")
        for pair in pairs:
            fidelity.items += [
                fidelity_table_html(pair.simulated, pair.real),
                fidelity_figures.step_duration_figure(pair),
                fidelity_figures.error_histogram_figure(pair),
                fidelity_figures.request_latency_figure(pair),
            ]
        sections.append(fidelity)
    if sweep is not None:
        interactivity = interactivity_figure(sweep)
        sections.append(Section("sweep", "Sweep", [sweep_figures.latency_throughput_figure(sweep),
                                                   *([interactivity] if interactivity is not None else [])]))
    sections.append(Section("latency", "Latency", [latency_cdf_figure(runs)]))
    request_class_figures = [figure for figure in (class_distribution_figure(runs), class_bar_figure(runs))
                             if figure is not None]
    if request_class_figures:
        sections.append(Section("classes", "Request classes", request_class_figures))
    by_class = priority_class_figure(runs)
    if by_class is not None:
        sections.append(Section("priority", "Priority classes", [by_class]))
    by_replica = replica_figure(runs)
    if by_replica is not None:
        sections.append(Section("replicas", "Replicas", [by_replica]))
    scaling = autoscaling_figure(runs)
    if scaling is not None:
        sections.append(Section("autoscaling", "Autoscaling", [scaling]))
    images = multimodal_figure(runs)
    if images is not None:
        sections.append(Section("images", "Images", [images]))
    session_turns = session_turns_figure(runs)
    if session_turns is not None:
        sections.append(Section("sessions", "Multi-turn sessions", [session_turns]))
    ttft_parts = ttft_parts_figure(runs)
    if ttft_parts is not None:
        sections.append(Section("disaggregation", "Disaggregated prefill and decode", [ttft_parts]))
    sections += [
        Section("throughput", "Throughput", [throughput_figure(runs)]),
        Section("scheduler", "Scheduler", [scheduler_state_figure(runs)]),
        Section("cache", "KV cache and prefix cache", [kv_usage_figure(runs), prefix_hit_figure(runs)]),
        Section("timeline", "Request timeline", [timeline_figure(runs)]),
        Section("configuration", "Configuration", [config_html(runs)]),
    ]
    return Dashboard(title or default_title(runs, sweep, pairs), _subtitle(runs), sections, runs)


def build_dashboard(run_dirs_or_runs: RunInput | Iterable[RunInput], out_path: str | Path,
                    title: str | None = None, *, png_dir: str | Path | None = None,
                    browser_probe: bool = False) -> Path:
    """Write one self-contained HTML dashboard for the given runs; return its path.

    `run_dirs_or_runs`: run directories, loaded `analysis.Run`s, or a sweep directory (its points).
    `png_dir`: also export each figure as a PNG there, when kaleido is installed (skipped otherwise,
    with a message). `browser_probe` is for tests: see analysis.dashboard.page.
    """
    dashboard = assemble_dashboard(prepare_runs(run_dirs_or_runs), title)
    return write_dashboard(dashboard, out_path, png_dir=png_dir, browser_probe=browser_probe)


def write_dashboard(dashboard: Dashboard, out_path: str | Path, *, png_dir: str | Path | None = None,
                    browser_probe: bool = False) -> Path:
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(dashboard.html(browser_probe=browser_probe), encoding="utf-8")
    if png_dir is not None:
        # Imported here: PNG export is optional and its dependencies are heavy.
        from analysis.dashboard.png_export import export_pngs

        export_pngs(dashboard.figures, Path(png_dir))
    return out_path


def write_run_dashboard(run_dir: str | Path, title: str | None = None) -> Path:
    """Write `<run_dir>/dashboard.html` for one run directory (what sim.run does after a run)."""
    return build_dashboard([run_dir], Path(run_dir) / DASHBOARD_FILE, title)


def default_title(runs: list[DashboardRun], sweep: sweep_figures.Sweep | None,
                  pairs: list[fidelity_figures.FidelityPair]) -> str:
    if pairs:
        pair = pairs[0]
        return f"Fidelity: {pair.simulated.label} ({pair.simulated.mode}) vs {pair.real.label} (real)"
    if sweep is not None:
        name = runs[0].run.name or "runs"
        over = f" over {sweep.variable}" if sweep.variable else ""
        return f"Sweep of {name}{over} ({len(runs)} points)"
    if len(runs) == 1:
        return f"{runs[0].label} ({runs[0].mode}): serving dashboard"
    return f"{len(runs)} runs compared: {', '.join(run.label for run in runs)}"


def _subtitle(runs: list[DashboardRun]) -> str:
    total_requests = sum(len(run.requests) for run in runs)
    total_steps = sum(len(run.steps) for run in runs)
    return f"{len(runs)} run(s), {total_requests:,} requests, {total_steps:,} engine steps"
