"""Run a workload: ``python -m sim.run [WORKLOAD.yaml] [--set PATH=VALUE ...] [--out DIR]``.

Without a workload file it runs the embedded default (workloads/examples/chat.yaml): a chat service
on Llama-3-8B / H100, simulated in seconds on a laptop with the project's real scheduler making every
decision. A workload with a ``sweep`` runs every point (in parallel with ``--jobs``) and prints a table
of all of them.

``--executor real`` runs the same request stream on the real model runner at wall-clock arrival times
(default model: the project's generated "small" Llama on the CPU); ``--replay RUN_DIR`` re-simulates a
real run with its recorded step durations and checks that every scheduling decision is the same. Each run writes ``requests.parquet``, ``steps.parquet`` and ``summary.json``, and
``dashboard.html`` (a sweep: one page over all its points) unless ``--no-dashboard``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rich.console import Console

from analysis import print_comparison, print_summary
from engine.optional_dependencies import exit_for_missing_extra
from sim.cli_support import check_output_directory, flags_given, positive_int, warnings_as_lines
from sim.cost_models.calibrated_range import describe_extrapolation
from sim.engine_setup import SetupError
from sim.sweep import run_sweep
from sim.run_pipeline import run_simulation
from workloads import WorkloadError, example_path, load_workload

DEFAULT_WORKLOAD = "chat"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m sim.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workload", nargs="?", help="a workload YAML file, or the name of a shipped example "
                        f"(default: {DEFAULT_WORKLOAD})")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE",
                        help="override a field, e.g. --set engine.max_num_seqs=128 (repeatable)")
    parser.add_argument("--out", type=Path, help="run directory (default: runs/<name>)")
    parser.add_argument("--cost-model", default=None,
                        help="'analytical' (default) or a calibrated step profile (.json)")
    parser.add_argument("--jobs", type=positive_int, default=1, help="sweep points run in parallel processes")
    parser.add_argument("--no-fast-forward", action="store_true",
                        help="take every decode step one by one (same results, slower; for checking)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--quiet", action="store_true", help="print only the final line")
    parser.add_argument("--no-dashboard", action="store_true", help="do not write dashboard.html")
    real = parser.add_argument_group("real runs")
    real.add_argument("--executor", choices=("sim", "real", "server"), default="sim",
                      help="sim (default): the simulator; real: the model runner in this process; "
                           "server: an OpenAI-compatible server at --url")
    real.add_argument("--model", default=None,
                      help="real runs: 'tiny', 'small' (default), 'tiny-llava', 'small-llava' (a workload with images "
                           "on a generated LLaVA defaults to it) or a checkpoint folder")
    real.add_argument("--device", default="cpu", help="real runs: cpu or cuda")
    real.add_argument("--dtype", default="auto", help="real runs: auto, float32, bfloat16 or float16")
    real.add_argument("--attention-backend", default=None, help="real runs: torch, flash_attn or triton")
    real.add_argument("--enforce-eager", action="store_true", help="real runs on CUDA: no CUDA graphs for decodes")
    real.add_argument("--threads", type=positive_int, default=1,
                      help="real runs on the CPU: torch threads (default 1)")
    real.add_argument("--speed-probe", action="store_true",
                      help="--executor real: time a fixed probe before and after the run (sim/speed_probe.py)")
    real.add_argument("--url", default="http://127.0.0.1:8000", help="--executor server: the server's base URL")
    real.add_argument("--api-key", default=None,
                      help="--executor server: the key the server asks for (default: the OPENAI_API_KEY environment "
                           "variable, as vLLM's bench serve reads it)")
    real.add_argument("--replay", type=Path, metavar="REAL_RUN_DIR",
                      help="re-simulate a real run with its recorded step durations and compare decisions")
    args = parser.parse_args(argv)
    check_flags_apply(parser, args)
    check_output_directory(parser, "--out", args.out)
    return args


# The flags that only one executor reads: given to another, they would silently do nothing.
EXECUTOR_FLAGS = {
    "sim": ["--cost-model", "--jobs", "--no-fast-forward"],
    "real": ["--model", "--device", "--dtype", "--attention-backend", "--enforce-eager", "--threads", "--speed-probe"],
    "server": ["--url", "--api-key"],
}


def check_flags_apply(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse a flag that the run asked for would ignore (exit 2), rather than run without it."""
    if args.replay is not None:
        if args.workload is not None:
            parser.error(f"give a workload ({args.workload!r}) or --replay REAL_RUN_DIR, not both: a replay runs "
                         "the recorded run's own workload")
        ignored = flags_given(parser, args, ["--set", "--executor", *(flag for flags in EXECUTOR_FLAGS.values()
                                                                      for flag in flags)])
        if ignored:
            parser.error(f"{', '.join(ignored)}: not used by --replay, which re-simulates the recorded run with its "
                         "own configuration and step durations")
        return
    for executor, flags in EXECUTOR_FLAGS.items():
        ignored = flags_given(parser, args, flags) if executor != args.executor else []
        if ignored:
            parser.error(f"{', '.join(ignored)}: {'apply' if len(ignored) > 1 else 'applies'} to --executor "
                         f"{executor} only, and this run uses --executor {args.executor}")


def resolve_workload_path(value: str | None) -> Path:
    if value is None:
        return example_path(DEFAULT_WORKLOAD)
    path = Path(value)
    if path.exists() or path.suffix in (".yaml", ".yml"):
        return path
    return example_path(value)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with warnings_as_lines():  # e.g. a --cost-model profile fitted for other hardware: one clean line
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    console = Console(stderr=False)
    try:
        progress = not (args.no_progress or args.quiet)
        if args.replay is not None:
            return _replay(args, console)
        path = resolve_workload_path(args.workload)
        workload = load_workload(path, overrides=args.overrides)
        out_dir = args.out or Path("runs") / workload.name
        if args.executor != "sim":
            if workload.sweep:
                raise SetupError("sweep: real runs take one point at a time (use --set to pick it)")
            return _real(args, workload, out_dir, progress, console)
        if workload.sweep:
            results = run_sweep(workload, out_dir, cost_model=args.cost_model, jobs=args.jobs, progress=progress,
                                fast_forward=not args.no_fast_forward)
            if not args.quiet:
                print_comparison([result.summary for result in results], [result.label for result in results],
                                 console=console)
            console.print(f"sweep of {len(results)} points written to {out_dir}/ (table: {out_dir}/sweep.csv)")
            if not args.no_dashboard:
                write_dashboard(out_dir, None if args.quiet else console)
            return 0
        result = run_simulation(workload, out_dir, cost_model=args.cost_model, progress=progress,
                                fast_forward=not args.no_fast_forward)
    except (WorkloadError, SetupError, FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as error:
        return exit_for_missing_extra(error, "--replay" if args.replay else f"--executor {args.executor}")
    if not args.quiet:
        print_summary(result.summary, console=console)
    console.print(f"simulated {result.num_requests} requests in {result.wall_s:.2f} s wall-clock "
                  f"({result.num_requests / max(result.wall_s, 1e-9):,.0f} requests/s); run written to {out_dir}/")
    note = describe_extrapolation(result.summary["cost_model_extrapolation"]) \
        if "cost_model_extrapolation" in result.summary else None
    if note:
        console.print(f"[yellow]note:[/yellow] {note}")
    if not args.no_dashboard:
        write_dashboard(out_dir, None if args.quiet else console)
    return 0


def _real(args, workload, out_dir: Path, progress: bool, console: Console) -> int:
    if args.executor == "server":
        from sim.server_run import run_against_server

        summary = run_against_server(workload, args.url, out_dir, progress=progress,
                                     api_key=args.api_key or os.environ.get("OPENAI_API_KEY") or None)
        wall = summary.get("duration_s") or 0.0
    else:
        from sim.real_engine import build_real_engine
        from sim.real_run import run_real

        real = build_real_engine(workload, model=args.model, device=args.device, dtype=args.dtype,
                                 attention_backend=args.attention_backend, threads=args.threads,
                                 enforce_eager=args.enforce_eager)
        result = run_real(workload, out_dir, real.engine, vocab_size=real.vocab_size,
                          reserved_token_ids=real.reserved_token_ids, executor_info=real.info, progress=progress,
                          speed_probe=args.speed_probe, lora_paths=real.lora_paths,
                          lora_manager=real.lora_manager, images=real.images)
        summary, wall = result.summary, result.wall_s
    if not args.quiet:
        print_summary(summary, console=console)
    console.print(f"ran {summary['num_requests']} requests for real in {wall:.1f} s; run written to {out_dir}/")
    if not args.no_dashboard:
        write_dashboard(out_dir, None if args.quiet else console)
    if summary["num_requests"] and summary.get("num_errored") == summary["num_requests"]:
        # Nothing was served: a script that checks the exit status must not take this for a measurement.
        first = (summary.get("errored_examples") or [{"reason": "no reason recorded"}])[0]["reason"]
        print(f"error: every request failed; the first: {first}", file=sys.stderr)
        return 1
    return 0


def _replay(args, console: Console) -> int:
    from sim.cost_models.replay import ReplayDivergedError
    from sim.replay import run_replay

    out_dir = args.out or Path(str(args.replay).rstrip("/") + "-replay")
    try:
        result, report = run_replay(args.replay, out_dir)
    except ReplayDivergedError as error:
        # The simulation stopped at the first step whose token count differs from the recording: the
        # answer a replay exists to give (exit 1, as for any other difference), not a crash.
        console.print(f"replay DIVERGED: {error}")
        return 1
    if not args.quiet:
        print_summary(result.summary, console=console)
    console.print(report.describe())
    console.print(f"replay written to {out_dir}/")
    if not args.no_dashboard:
        from analysis.dashboard import build_dashboard

        path = build_dashboard([args.replay, out_dir], Path(out_dir) / "dashboard.html")
        if not args.quiet:
            console.print(f"dashboard (real beside replay): {path}")
    return 0 if report.identical else 1


# --- dashboard (issue 6) ---------------------------------------------------------------------------
def write_dashboard(out_dir: Path, console: Console | None) -> None:
    """<out_dir>/dashboard.html: of the run, or of every point when out_dir is a sweep directory."""
    # Imported here: plotly costs a noticeable fraction of a second, which --no-dashboard skips.
    from analysis.dashboard import DASHBOARD_FILE, build_dashboard

    path = build_dashboard([out_dir], Path(out_dir) / DASHBOARD_FILE)
    if console is not None:
        console.print(f"dashboard: {path}")


if __name__ == "__main__":
    sys.exit(main())
