"""`python -m sim.run` leaves a dashboard.html beside the traces, unless told not to."""

from __future__ import annotations

from pathlib import Path

from analysis.dashboard.page import self_containment_problems
from sim.run import main as sim_run_main

SMALL = ["chat", "--set", "workload.num_requests=40", "--no-progress", "--quiet"]


def test_sim_run_writes_a_dashboard_and_no_dashboard_skips_it(tmp_path: Path) -> None:
    assert sim_run_main([*SMALL, "--out", str(tmp_path / "with")]) == 0
    page = (tmp_path / "with" / "dashboard.html").read_text(encoding="utf-8")
    assert self_containment_problems(page) == [] and 'id="latency-cdf"' in page

    assert sim_run_main([*SMALL, "--out", str(tmp_path / "without"), "--no-dashboard"]) == 0
    assert (tmp_path / "without" / "summary.json").is_file()
    assert not (tmp_path / "without" / "dashboard.html").exists()
