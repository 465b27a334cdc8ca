"""Plotly dashboards of run directories: one self-contained HTML page per run, run set, sweep, or real
run beside its simulation.

    python -m analysis.dashboard RUN_DIR [RUN_DIR ...] -o report.html [--title TEXT] [--png-dir DIR]

    from analysis.dashboard import build_dashboard, write_run_dashboard
    build_dashboard(["runs/a", "runs/b"], "report.html")
    write_run_dashboard("runs/chat")            # -> runs/chat/dashboard.html
"""

from analysis.dashboard.build import (
    DASHBOARD_FILE,
    Dashboard,
    assemble_dashboard,
    build_dashboard,
    prepare_runs,
    write_dashboard,
    write_run_dashboard,
)

__all__ = [
    "DASHBOARD_FILE",
    "Dashboard",
    "assemble_dashboard",
    "build_dashboard",
    "prepare_runs",
    "write_dashboard",
    "write_run_dashboard",
]
