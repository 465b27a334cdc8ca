"""Analysis of run directories: trace schema, metrics, reports and sim-vs-real fidelity.

Imports pandas, numpy, pyarrow, plotly and rich only: never torch, simpy or the engine, so a run
directory can be analysed on any machine.
"""

from analysis.fidelity import (
    FIDELITY_METRICS,
    compare_runs,
    format_fidelity_report,
    print_fidelity_report,
    relative_error,
)
from analysis.json_safe import json_safe
from analysis.metrics import (
    LATENCY_METRICS,
    RUN_MODES,
    SLO_METRICS,
    compute_summary,
    flatten_token_times,
    inter_token_latencies,
    latency_stats,
    request_latencies,
    run_duration,
)
from analysis.report import (
    format_comparison,
    format_summary,
    print_comparison,
    print_summary,
)
from analysis.run_dir import Run, read_run, write_run, write_summary
from analysis.trace_schema import (
    COMPLETED_FINISH_REASONS,
    FINISH_REASONS,
    REQUESTS_SCHEMA,
    REQUIRED_REQUEST_COLUMNS,
    REQUIRED_STEP_COLUMNS,
    STEPS_SCHEMA,
    check_requests_frame,
    check_steps_frame,
    requests_table,
    steps_table,
)

__all__ = [
    "COMPLETED_FINISH_REASONS",
    "FIDELITY_METRICS",
    "FINISH_REASONS",
    "LATENCY_METRICS",
    "REQUESTS_SCHEMA",
    "REQUIRED_REQUEST_COLUMNS",
    "REQUIRED_STEP_COLUMNS",
    "RUN_MODES",
    "Run",
    "SLO_METRICS",
    "STEPS_SCHEMA",
    "check_requests_frame",
    "check_steps_frame",
    "compare_runs",
    "compute_summary",
    "flatten_token_times",
    "format_comparison",
    "format_fidelity_report",
    "format_summary",
    "inter_token_latencies",
    "json_safe",
    "latency_stats",
    "print_comparison",
    "print_fidelity_report",
    "print_summary",
    "read_run",
    "relative_error",
    "request_latencies",
    "requests_table",
    "run_duration",
    "steps_table",
    "write_run",
    "write_summary",
]
