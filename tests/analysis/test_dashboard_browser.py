"""Pages render in a real browser: every figure drawn, no JavaScript error. Skipped without Chromium.

One page covers every kind of figure: three runs where two simulations differ only in arrival rate
(a sweep), a real run of the same request stream as one of them, and a replay of that stream whose
steps diverged (fidelity pairs, one with steps that correspond one to one and one without), so a single
browser load checks them all.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis import read_run, write_run
from analysis.dashboard import assemble_dashboard, prepare_runs, write_dashboard
from analysis.dashboard.browser import find_chromium, probe_page
from analysis.dashboard.synthetic_run import synthetic_run

pytestmark = pytest.mark.skipif(find_chromium() is None, reason="no Chromium installed (.ci/install-chromium)")


def test_every_kind_of_figure_renders_without_javascript_errors(tmp_path: Path) -> None:
    sim = synthetic_run(tmp_path / "sim", num_requests=150, rate=20.0, seed=7, name="sim", mode="sim")
    real = synthetic_run(tmp_path / "real", num_requests=150, rate=20.0, seed=7, name="real", mode="real",
                         step_noise=0.1)
    faster = synthetic_run(tmp_path / "sim-fast", num_requests=150, rate=40.0, seed=7, name="sim-fast", mode="sim")
    # A replay of the real run's request stream whose scheduling diverged (fewer steps): the second pair.
    diverged_dir = synthetic_run(tmp_path / "replay", num_requests=150, rate=20.0, seed=7, name="replay",
                                 mode="replay")
    diverged = read_run(diverged_dir)
    write_run(diverged_dir, diverged.requests, diverged.steps.iloc[:-3], diverged.summary)

    # The faster run as an autoscaled cluster's (sim/autoscaler.py's summary entry): the Autoscaling section.
    scaled = read_run(faster)
    scaled.summary["autoscaling"] = {
        "metric": "outstanding", "target": 8.0, "replica_hours": 0.01, "gpu_hours": 0.01, "static_replica_hours": 0.02,
        "saved_fraction": 0.5, "mean_replicas": 1.5, "peak_replicas": 2, "scale_ups": 1, "scale_downs": 1,
        "timeline": {"time_s": [0.0, 1.0, 1.0, 2.0, 3.0], "ready": [1, 1, 1, 2, 1], "powered": [1, 2, 2, 2, 1],
                     "desired": [None, 2, None, 2, None], "metric": [None, 12.0, None, 9.0, None]}}
    write_run(faster, scaled.requests, scaled.steps, scaled.summary)

    # The first run as one with images (analysis/multimodal_stats.py's columns and summary): the Images section.
    shown = read_run(sim)
    requests, steps = shown.requests.copy(), shown.steps.copy()
    requests["num_images"] = [index % 3 for index in range(len(requests))]
    requests["num_image_tokens"] = requests["num_images"] * 256
    steps["num_encoder_items"] = [index % 2 for index in range(len(steps))]
    steps["num_encoder_tokens"] = steps["num_encoder_items"] * 256
    shown.summary["multimodal"] = {"images_shown": int(requests["num_images"].sum())}
    write_run(sim, requests, steps, shown.summary)

    dashboard = assemble_dashboard(prepare_runs([sim, real, faster, diverged_dir]))
    ids = {figure.figure_id for figure in dashboard.figures}
    assert {"latency-throughput", "fidelity-step-duration", "fidelity-step-duration-2", "autoscaling-timeline",
            "multimodal"} <= ids
    page = write_dashboard(dashboard, tmp_path / "all.html", browser_probe=True)

    result = probe_page(page, timeout_s=120)
    assert result.errors == 0, result.error_text
    assert result.rendered == result.expected == len(dashboard.figures)
