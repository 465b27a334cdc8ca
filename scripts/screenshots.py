"""Screenshots of the dashboard's main views for the docs: ``python scripts/screenshots.py``.

Runs fresh simulations (the chat workload with a KV cache small enough to preempt, and the rate
sweep), makes a "real" run from the chat run by perturbing its step durations (no real run exists on
a laptop; this stands in for one so the fidelity view has something to show), builds the dashboards
and photographs each view with headless Chromium into docs/images/.

Each view is rendered as its own page holding only that view's sections, so a screenshot is always
the top of a page (headless Chromium does not repaint reliably after scrolling to an anchor).
Screenshots are downscaled with Pillow when it is installed, to stay small in the repository.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPOSITORY = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPOSITORY))

from analysis import compute_summary, read_run, write_run  # noqa: E402
from analysis.dashboard import assemble_dashboard, prepare_runs  # noqa: E402
from analysis.dashboard.browser import find_chromium, screenshot  # noqa: E402
from analysis.dashboard.build import Dashboard  # noqa: E402

WINDOW_WIDTH = 1400
# Downscaled width of the saved PNG (when Pillow is available): readable, and ~100-250 KB.
SAVED_WIDTH = 1100


@dataclass
class View:
    file_name: str
    dashboard: str        # which dashboard: "single", "sweep" or "fidelity"
    sections: tuple[str, ...]
    height: int


VIEWS = (
    View("dashboard-overview.png", "single", ("overview",), 760),
    View("dashboard-latency.png", "single", ("latency",), 1000),
    View("dashboard-throughput.png", "single", ("throughput",), 860),
    View("dashboard-scheduler.png", "single", ("scheduler",), 1000),
    View("dashboard-kv-cache.png", "single", ("cache",), 1160),
    View("dashboard-timeline.png", "single", ("timeline",), 1000),
    View("dashboard-sweep.png", "sweep", ("sweep",), 760),
    View("dashboard-sweep-latency.png", "sweep", ("latency",), 1000),
    View("dashboard-fidelity.png", "fidelity", ("fidelity",), 1560),
)


def simulate(arguments: list[str]) -> None:
    command = [sys.executable, "-m", "sim.run", *arguments, "--quiet", "--no-progress"]
    print("+", " ".join(command), flush=True)
    subprocess.run(command, cwd=REPOSITORY, check=True)


def make_real_stand_in(sim_dir: Path, real_dir: Path, seed: int = 0) -> Path:
    """A "real" run made from a simulated one: every step takes 3% longer, with 8% noise.

    The scheduler decisions are kept (same steps), so the fidelity view can join steps one to one.
    Every timestamp moves with the step it fell in: time is remapped piecewise linearly from the
    simulated step boundaries to the perturbed ones. Arrivals move too, which a real run would not
    do, but keeping them would turn a few percent of drift into minutes of made-up queueing.
    """
    run = read_run(sim_dir)
    steps = run.steps.copy()
    generator = np.random.default_rng(seed)
    start = steps["start_time"].to_numpy(dtype=np.float64)
    duration = steps["duration"].to_numpy(dtype=np.float64)
    idle_before = np.diff(start, prepend=0.0) - np.r_[0.0, duration[:-1]]
    new_duration = duration * 1.03 * generator.lognormal(0.0, 0.08, size=duration.size)
    new_start = np.cumsum(np.maximum(idle_before, 0.0) + np.r_[0.0, new_duration[:-1]])
    steps["start_time"], steps["duration"] = new_start, new_duration
    old_points = np.r_[start, start[-1] + duration[-1]]
    new_points = np.r_[new_start, new_start[-1] + new_duration[-1]]

    def remap(times: np.ndarray) -> np.ndarray:
        return np.interp(times, old_points, new_points)

    requests = run.requests.copy()
    for column in ("arrival_time", "scheduled_time", "first_token_time", "finish_time"):
        requests[column] = remap(requests[column].to_numpy(dtype=np.float64))
    requests["token_times"] = [remap(np.asarray(times, dtype=np.float64)) for times in requests["token_times"]]
    summary = compute_summary(requests, steps, name=f"{run.name}-real", mode="real",
                              config=run.summary.get("config"), slo=run.summary.get("slo"))
    return write_run(real_dir, requests, steps, summary)


def view_page(dashboard: Dashboard, view: View) -> str:
    sections = [section for section in dashboard.sections if section.section_id in view.sections]
    if not sections:
        raise ValueError(f"view {view.file_name}: the dashboard has none of the sections {view.sections}")
    return Dashboard(dashboard.title, dashboard.subtitle, sections, dashboard.runs).html()


def save_small(raw_png: Path, out_png: Path) -> None:
    try:
        from PIL import Image
    except ImportError:
        out_png.write_bytes(raw_png.read_bytes())
        return
    with Image.open(raw_png) as image:
        height = round(image.height * SAVED_WIDTH / image.width)
        image.convert("RGB").resize((SAVED_WIDTH, height), Image.LANCZOS).save(out_png, optimize=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPOSITORY / "docs" / "images", help="where the PNGs go")
    parser.add_argument("--work", type=Path, help="keep runs and pages here (default: a temporary directory)")
    parser.add_argument("--fidelity", type=Path, nargs=2, metavar=("SIM_RUN", "REAL_RUN"),
                        help="a simulated run and the real run of the same workload for the fidelity view "
                             "(e.g. the sim/ and real/ folders of `python -m sim.validate`); default: a "
                             "perturbed copy of the chat run stands in for the real one")
    args = parser.parse_args(argv)
    if find_chromium() is None:
        print("no Chromium found: install it (e.g. .ci/install-chromium) to take screenshots", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="dashboard-screenshots-") as temporary:
        work = args.work or Path(temporary)
        simulate(["chat", "--set", "engine.num_gpu_blocks=1800", "--set", "workload.arrival.rate=12",
                  "--out", str(work / "chat")])
        simulate(["rate_sweep", "--out", str(work / "rate_sweep")])
        fidelity_runs = list(args.fidelity) if args.fidelity else [work / "chat", work / "chat-real"]
        if not args.fidelity:
            make_real_stand_in(work / "chat", work / "chat-real")
        dashboards = {
            "single": assemble_dashboard(prepare_runs([work / "chat"])),
            "sweep": assemble_dashboard(prepare_runs([work / "rate_sweep"])),
            "fidelity": assemble_dashboard(prepare_runs(fidelity_runs)),
        }
        args.out.mkdir(parents=True, exist_ok=True)
        for view in VIEWS:
            page = work / "pages" / view.file_name.replace(".png", ".html")
            page.parent.mkdir(parents=True, exist_ok=True)
            page.write_text(view_page(dashboards[view.dashboard], view), encoding="utf-8")
            raw = screenshot(page.resolve().as_uri(), work / "raw" / view.file_name, WINDOW_WIDTH, view.height)
            save_small(raw, args.out / view.file_name)
            print(f"{args.out / view.file_name}: {(args.out / view.file_name).stat().st_size / 1e3:.0f} KB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
