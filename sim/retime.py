"""Re-time a recorded run: execute its exact schedule again on this machine's real engine.

A real run's schedule depends on its timing (a request that arrives during a long step waits for the
next one), so two real runs of one workload schedule differently and their step times cannot be
compared one to one. Re-timing removes that: the engine's clock advances by the *recorded* duration of
each step, so every arrival joins at the same step as in the recorded run and the scheduler makes the
same decisions (checked step by step, as a replay does), while each step's model work really runs and
its wall time is measured. The result is a run directory with the recorded schedule and today's step
durations: the same steps timed twice, on one machine at two moments (how steady its timing is) or on
two machines (what the step-time model would have to transfer), or one schedule timed under several
engine settings.

    python -m sim.retime RECORDED_RUN_DIR --out RETIMED_RUN_DIR

Only the step durations change: request timestamps are the recorded run's, because they follow from
the recorded durations.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import read_run, write_run
from engine.core import EngineCore
from engine.optional_dependencies import exit_for_missing_extra
from sim.cli_support import check_output_directory, positive_int
from sim.cost_models.replay import ReplayDivergedError
from sim.machine_load import MachineLoad
from sim.replay import replay_inputs
from sim.wall_clock_driver import RecordedTimeline, run_wall_clock


def retime_schedule(engine: EngineCore, requests, recorded_durations: list[float],
                    recorded_tokens: list[int], lora_paths: dict[str, str] | None = None,
                    max_concurrency: int | None = None, image_pixels=None, temperature: float | None = None
                    ) -> list[float]:
    """Run the engine on ``requests`` with a clock that advances by the recorded step durations; return
    each step's measured wall time (the same span a real run measures: the whole engine step). ``lora_paths``:
    a LoRA run's adapter folders (sim/real_lora_adapters.py); ``image_pixels``: its images' (sim/real_images.py);
    ``temperature``: the recording's workload.temperature (a speculating engine's schedule follows its tokens)."""
    timeline = RecordedTimeline(recorded_durations, recorded_tokens)
    run_wall_clock(engine, requests, record_schedule=False, timeline=timeline, lora_paths=lora_paths,
                   max_concurrency=max_concurrency, image_pixels=image_pixels, temperature=temperature)
    return timeline.measured


def retime_run(run_dir: str | Path, out_dir: str | Path | None, *, model: str | None = None, device: str = "cpu",
               dtype: str | None = None, attention_backend: str | None = None, threads: int = 1) -> pd.DataFrame:
    """Re-time ``run_dir`` on a freshly built real engine; write the re-timed run to ``out_dir``; return a
    table of recorded and measured duration per step."""
    from sim.real_engine import build_real_engine
    from workloads import load_workload

    run = read_run(run_dir)
    scheduler_config, cache_config, requests = replay_inputs(run)
    config = run.summary["config"]
    executor = config.get("executor", {})
    workload = load_workload(config["workload"])
    if model is None:  # the recorded run's model: a generated one by its size, else its checkpoint
        recorded_model = str(executor.get("model", ""))
        model = recorded_model.removeprefix("servesim-") if recorded_model.startswith("servesim-") \
            else executor.get("model_path")
    real = build_real_engine(workload, model=model, device=device, dtype=dtype or executor.get("dtype", "auto"),
                             attention_backend=attention_backend or executor.get("attention_backend"), threads=threads)
    if real.vocab_size != config["vocab_size"]:
        raise ValueError(f"{run_dir} was recorded with a vocabulary of {config['vocab_size']} tokens, this model has "
                         f"{real.vocab_size}: re-time it on the same model")
    steps = run.steps.sort_values("step").reset_index(drop=True)
    recorded = steps["duration"].tolist()
    load = MachineLoad.start()
    image_pixels = real.images.pixels(requests) if real.images is not None and workload.has_images() else None
    measured = retime_schedule(real.engine, requests, recorded, steps["num_scheduled_tokens"].tolist(),
                               real.lora_paths, workload.workload.max_concurrency, image_pixels,
                               workload.workload.temperature)
    machine_load = load.summary(sum(measured) if real.info.get("device") == "cpu" else None)
    if out_dir is not None:
        retimed = steps.copy()
        retimed["duration"] = measured
        summary = dict(run.summary)
        summary["config"] = dict(config, executor=real.info)
        summary["retimed_from"] = {"run": str(run_dir), "recorded_executor": executor,
                                   "recorded_machine_load": run.summary.get("machine_load")}
        summary["machine_load"] = machine_load
        write_run(Path(out_dir), run.requests, retimed, summary)
    return pd.DataFrame({"step": steps["step"], "has_prefill": steps["num_prefill_reqs"] > 0,
                         "recorded_s": recorded, "measured_s": measured})


def describe(table: pd.DataFrame) -> str:
    ratio = table["measured_s"] / table["recorded_s"]
    lines = [f"{len(table)} steps, same schedule: measured / recorded duration, median {np.median(ratio):.3f}, "
             f"total {table['measured_s'].sum() / table['recorded_s'].sum():.3f}"]
    for name, selected in (("decode-only", ~table["has_prefill"]), ("with a prefill chunk", table["has_prefill"])):
        if selected.any():
            part = table[selected]
            lines.append(f"  {name}: {int(selected.sum())} steps, median {np.median(ratio[selected]):.3f}, total "
                         f"{part['measured_s'].sum() / part['recorded_s'].sum():.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.retime", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", help="a recorded real run directory")
    parser.add_argument("--out", help="write the re-timed run directory here")
    parser.add_argument("--model", help="checkpoint directory (default: the recorded run's model)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", help="default: the recorded run's")
    parser.add_argument("--attention-backend", help="default: the recorded run's")
    parser.add_argument("--threads", type=positive_int, default=1)
    args = parser.parse_args(argv)
    check_output_directory(parser, "--out", args.out)
    try:
        table = retime_run(args.run_dir, args.out, model=args.model, device=args.device, dtype=args.dtype,
                           attention_backend=args.attention_backend, threads=args.threads)
    except (ValueError, FileNotFoundError, ReplayDivergedError) as error:  # not a real run, no such directory, a diverged schedule
        print(f"error: {error}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as error:
        return exit_for_missing_extra(error, "sim.retime (it executes the schedule on the model)")
    print(describe(table))
    if args.out:
        print(f"re-timed run written to {args.out}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
