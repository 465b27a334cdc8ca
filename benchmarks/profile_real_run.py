"""Where a real run's step time goes: the engine's Python (cProfile) and the device's kernels (torch.profiler).

    python -m benchmarks.profile_real_run WORKLOAD [--device cuda] [--dtype bfloat16] [--set PATH=VALUE ...]
                                           [--top 30] [--save-dir DIR]

The workload runs twice for real, as ``sim.run --executor real`` runs it: once under cProfile (the
functions with the most own time, i.e. host overhead per call site), once under torch.profiler (time
per operator and kernel, host and device). Each table also goes to ``--save-dir`` as text. Use a short
workload (a few hundred requests): both profilers slow the run down, so the figures are for finding
where time goes, not for calibration.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

from sim.run import resolve_workload_path
from workloads import load_workload


def _run(workload, args):
    """A real engine built for the workload, and a callable that runs the workload on it."""
    from sim.real_engine import build_real_engine
    from sim.real_run import run_real

    real = build_real_engine(workload, model=args.model, device=args.device, dtype=args.dtype,
                             attention_backend=args.attention_backend, enforce_eager=args.enforce_eager)
    return real, lambda: run_real(workload, None, real.engine, vocab_size=real.vocab_size,
                                  reserved_token_ids=real.reserved_token_ids, executor_info=real.info,
                                  images=real.images)


def python_profile(workload, args) -> str:
    _, run = _run(workload, args)
    profiler = cProfile.Profile()
    profiler.enable()
    run()
    profiler.disable()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text).strip_dirs()
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("cumulative").print_stats(args.top)
    return text.getvalue()


def torch_profile(workload, args) -> str:
    import torch
    from torch.profiler import ProfilerActivity, profile

    _, run = _run(workload, args)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
    with profile(activities=activities) as profiler:
        run()
        if args.device == "cuda":
            torch.cuda.synchronize()
    sort = "self_cuda_time_total" if args.device == "cuda" else "self_cpu_time_total"
    return (profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top) + "\n"
            + profiler.key_averages().table(sort_by=sort, row_limit=args.top))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workload", help="a workload YAML file or the name of a shipped example")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE")
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--attention-backend", default=None)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--top", type=int, default=30, help="rows per table")
    parser.add_argument("--save-dir", type=Path, help="also write python_profile.txt and torch_profile.txt here")
    parser.add_argument("--only", choices=["python", "torch"], help="run one of the two profiles")
    args = parser.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: this machine has no CUDA device (torch.cuda.is_available() is False)")
    if args.save_dir:
        args.save_dir.mkdir(parents=True, exist_ok=True)  # before the work: a bad path fails at once
    workload = load_workload(resolve_workload_path(args.workload), overrides=args.overrides)
    for name, function in (("python", python_profile), ("torch", torch_profile)):
        if args.only and args.only != name:
            continue
        text = function(workload, args)
        print(f"===== {name} profile of {workload.name}\n{text}")
        if args.save_dir:
            args.save_dir.mkdir(parents=True, exist_ok=True)
            (args.save_dir / f"{name}_profile.txt").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
