"""Fidelity report: ``python -m sim.validate WORKLOAD.yaml [--profile profile.json]``.

Runs the workload for real (the model runner, wall-clock arrivals), then simulates the very same
request stream with the same engine configuration and a calibrated step-time profile, and compares
the two runs metric by metric: p50 / p90 / p99 of TTFT, TPOT, ITL and end-to-end latency, and
throughput, each with its relative error. Writes ``<out>/real``, ``<out>/sim``, ``<out>/comparison.json``
and ``<out>/dashboard.html`` (the two runs side by side).

``python -m sim.validate --real-run RUN_DIR [--profile P]`` compares with a real run recorded earlier
(e.g. the shipped runs in ``sim/data/runs/``) and runs only the simulation: no model, no GPU.

Without ``--profile`` the shipped profile fitted on the run's kind of device, model and dtype is used
(``sim/profile_match.py``); a profile fitted on other hardware is a warning, on another kind of device
(a CPU profile for a GPU run) an error unless ``--allow-profile-mismatch``.

``--repeats N`` records the workload N times (``<out>/real``, ``<out>/real-2``, ...; a fresh engine each
time) and also compares the simulation with each metric's mean over the recordings, next to how far the
recordings lie from that mean (``analysis/repeated_runs.py``): on a shared machine one recording's luck
can exceed the simulator's error.

A LoRA workload needs a profile fitted on LoRA runs (``--profile``; sim/calibrated_lora.py): the simulation
then prices the adapters' compute with its terms and their loads with its fitted load costs. The shipped
profiles have no adapter terms, and a LoRA workload is refused with them, with the commands that fit one.
Likewise a workload that speculates needs a profile fitted on n-gram runs (sim/calibrated_speculation.py,
sim/data/profiles/cpu-small-float32-ngram.json for the small model on the CPU), and its recording is simulated at
the acceptance and proposal rates it measured.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from analysis import compare_runs, print_fidelity_report, read_run, write_run
from analysis.run_dir import Run
from analysis.report import summary_value
from analysis.repeated_runs import compare_with_mean, spread_about_mean, standard_error_of_mean
from engine.core import EngineCore, Scheduler
from engine.optional_dependencies import exit_for_missing_extra
from sim.calibrate import speed_standard_error
from sim.calibrated_lora import check_profile_prices_lora, refuse_lora_without_profile, simulated_lora
from sim.calibrated_speculation import (check_profile_prices_speculation, measured_speculation,
                                        refuse_speculation_without_profile)
from sim.cli_support import check_output_directory, flags_given, positive_int, print_warning
from sim.cost_models import CalibratedCostModel
from sim.replay import replay_inputs
from sim.cost_models.calibrated_range import describe_extrapolation
from sim.run_pipeline import cost_model_extrapolation, summarize_traces
from sim.speculative_executor import make_executor
from sim.simulator import Simulation
from sim.machine_load import busy_machine_warning
from sim.profile_match import SHIPPED_PROFILES_DIR, check_profile_fits, default_profile_for
from sim.speed_probe import probed_speed, read_probe
from sim.step_time_error import describe_step_time_error, step_time_error
from sim.validate_report import (HEADLINE_METRICS, describe_headline_error, describe_machine_speed,
                                 describe_sensitivity, headline_error, step_kind_table)
from workloads import WorkloadError, load_workload

# The shipped CPU profile; sim.validate picks the shipped profile that fits each run (profile_match.py).
DEFAULT_PROFILE = SHIPPED_PROFILES_DIR / "cpu-small-float32.json"
# The speed change either side of the simulated one at which ``step_time_sensitivity`` simulates again:
# the machine's own drift between recordings (2-6%), so the slope spans what a percentile really does.
SENSITIVITY_STEP = 0.02
# sim.validate's flags that shape a recording, refused beside --real-run (a recording made earlier).
RECORDING_FLAGS = ["--set", "--model", "--device", "--dtype", "--attention-backend", "--enforce-eager", "--threads",
                   "--repeats", "--speed-probe"]


def simulate_like(real_run: Path | Run, profile: Path | CalibratedCostModel, out_dir: Path,
                  speed_factor: float = 1.0) -> dict:
    """Simulate the request stream and engine configuration of a recorded run with a calibrated profile
    (its step times scaled by ``speed_factor``). The run and the profile may come loaded, for callers
    that simulate one run several times."""
    run = real_run if isinstance(real_run, Run) else read_run(real_run)
    loaded = profile if isinstance(profile, CalibratedCostModel) else CalibratedCostModel.from_file(profile)
    cost_model = CalibratedCostModel(loaded.profile, path=loaded.path, speed_factor=speed_factor)
    scheduler_config, cache_config, requests = replay_inputs(run)
    workload = load_workload(run.summary["config"]["workload"])
    speculation = None
    if scheduler_config.num_speculative_tokens:
        # At the acceptance and proposal rates the recording measured: those are the workload's inputs, the timing
        # is what the profile predicts (sim/calibrated_speculation.py).
        check_profile_prices_speculation(loaded.profile, loaded.path or "(inline)",
                                         workload.engine.speculative_decoding.method)
        speculation = measured_speculation(run.summary, workload.seed, cost_model.ngram_lookup_s)
    executor = make_executor(cost_model, speculation)
    executor.lora = simulated_lora(workload, loaded.profile, loaded.path or "(inline)")
    engine = EngineCore(Scheduler(scheduler_config, cache_config), executor)
    started = time.perf_counter()
    recorder = Simulation(engine, requests, max_concurrency=workload.workload.max_concurrency).run()
    config = dict(run.summary["config"], cost_model=cost_model.describe(), simulated_from=str(run.path))
    if speculation is not None:  # the rates it simulated at: the recording's measured ones
        config["speculative_decoding"] = speculation.describe()
    requests_table, steps_table, summary = summarize_traces(recorder, workload, config, mode="sim")
    summary["simulation_wall_s"] = time.perf_counter() - started
    extrapolation = cost_model_extrapolation(cost_model, steps_table)
    if extrapolation is not None:
        summary["cost_model_extrapolation"] = extrapolation
    write_run(out_dir, requests_table, steps_table, summary)
    return summary


def real_run_dirs(out_dir: Path, repeats: int) -> list[Path]:
    """Where the recordings go: ``real`` (the one every single comparison uses), then ``real-2``, ..."""
    return [out_dir / ("real" if index == 0 else f"real-{index + 1}") for index in range(repeats)]


def validate(workload_path: Path, out_dir: Path, *, profile: Path | None = None, overrides=(), model=None,
             device: str = "cpu", threads: int = 1, progress: bool = True, dtype: str = "auto",
             attention_backend: str | None = None, enforce_eager: bool = False, repeats: int = 1,
             speed_probe: bool = False, at_probed_speed: bool = False, allow_profile_mismatch: bool = False) -> dict:
    """Record the workload ``repeats`` times and compare the simulation with the recordings. ``profile``
    None: the shipped profile that fits the first recording (``sim/profile_match.py``)."""
    from sim.real_engine import build_real_engine
    from sim.real_run import run_real

    if repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {repeats}")
    if profile is not None:
        # Refused before the recording rather than after it: a profile for another kind of device.
        check_profile_fits(CalibratedCostModel.from_file(profile).profile.provenance, {"device": device}, profile,
                           allow_mismatch=allow_profile_mismatch)
    workload = load_workload(workload_path, overrides=list(overrides))
    # Refused before the recording: a speculating workload without a profile that prices its drafts.
    refuse_speculation_without_profile(workload, profile)
    # Refused before the recording (and before stale recordings are removed): a profile without adapter terms.
    refuse_lora_without_profile(workload, profile)
    real_dirs = real_run_dirs(out_dir, repeats)
    remove_stale_recordings(out_dir, repeats)
    for real_dir in real_dirs:
        # A fresh engine per recording: one that served the workload already holds its prefixes cached.
        real = build_real_engine(workload, model=model, device=device, threads=threads, dtype=dtype,
                                 attention_backend=attention_backend, enforce_eager=enforce_eager)
        run_real(workload, real_dir, real.engine, vocab_size=real.vocab_size,
                 reserved_token_ids=real.reserved_token_ids, executor_info=real.info, progress=progress,
                 speed_probe=speed_probe, lora_paths=real.lora_paths, lora_manager=real.lora_manager,
                 images=real.images)
    comparison = validate_recorded(real_dirs[0], out_dir, profile=profile, workload_path=workload_path,
                                   at_probed_speed=at_probed_speed, allow_profile_mismatch=allow_profile_mismatch)
    if repeats > 1:
        comparison["repeats"] = compare_repeats(out_dir / "sim", real_dirs)
        (out_dir / "comparison.json").write_text(json.dumps(comparison, indent=2) + "\n")
    return comparison


def remove_stale_recordings(out_dir: Path, repeats: int) -> None:
    """Remove the ``real-N`` recordings an earlier ``--repeats`` left in ``out_dir`` beyond the ones this
    invocation writes: beside a fresh ``real/`` they would pass for its repeats (and the dashboard of a
    later look at the directory would overlay them). Only this tool's own naming is touched."""
    if not out_dir.is_dir():
        return
    for path in out_dir.iterdir():
        match = re.fullmatch(r"real-(\d+)", path.name)
        if match and path.is_dir() and int(match.group(1)) > repeats:
            shutil.rmtree(path)


def compare_repeats(sim_dir: Path, real_dirs: list[Path]) -> dict:
    """The simulation against every recording and against each metric's mean over them, the
    recordings' own spread about that mean, and that mean's standard error."""
    simulated = read_run(sim_dir).summary
    reals = [read_run(real_dir).summary for real_dir in real_dirs]
    return {
        "real_runs": [str(real_dir) for real_dir in real_dirs],
        "worst_headline_error_each": [headline_error(compare_runs(simulated, real)) for real in reals],
        "vs_mean": compare_with_mean(simulated, reals),
        "real_spread_about_mean": spread_about_mean(reals),
        "mean_standard_error": standard_error_of_mean(reals),
    }


def step_time_sensitivity(real_run: Path | Run, profile: Path | CalibratedCostModel, out_dir: Path,
                          simulated: dict, speed_factor: float) -> dict[str, float | None]:
    """Per headline metric, how many percent it moves per 1% more time in every step (simulated at
    +/-``SENSITIVITY_STEP`` around ``speed_factor``, divided by the central value): the gain from
    step-time error to latency error. Near saturation, or where a percentile sits between two modes,
    it is several times 1, and a step-time model (or a machine) off by 1% is off by that much there."""
    slower = simulate_like(real_run, profile, out_dir / "sim-slower", speed_factor * (1 + SENSITIVITY_STEP))
    faster = simulate_like(real_run, profile, out_dir / "sim-faster", speed_factor * (1 - SENSITIVITY_STEP))
    gains = {}
    for key in HEADLINE_METRICS:
        high, low, centre = (summary_value(summary, key) for summary in (slower, faster, simulated))
        gains[key] = None if not centre else (high - low) / centre / (2 * SENSITIVITY_STEP)
    return gains


def validate_recorded(real_run_dir: Path, out_dir: Path, *, profile: Path | None = None,
                      workload_path: Path | None = None, at_probed_speed: bool = False,
                      sensitivity: bool = True, allow_profile_mismatch: bool = False) -> dict:
    """The comparison for a real run recorded earlier: only the simulation runs (no model, no GPU).

    When the run recorded a speed probe and the profile a reference for it (``sim/speed_probe.py``), the
    machine's speed it measured is reported under ``machine_speed``; with ``at_probed_speed`` the
    simulation runs at that speed, and a second one at the profile's own speed is compared too, under
    ``at_profile_speed``. (On the shipped CPU runs the probe's speed helped 6 of 12 recordings: it
    catches the machine's speed within about 2%, no better than the drift it is meant to remove.)

    ``profile`` None: the shipped profile that fits the run (``sim/profile_match.py``). What the user
    should know before reading the figures (a profile fitted for other hardware, a probe that is not
    there) is listed under ``warnings``; a profile for another kind of device is refused unless
    ``allow_profile_mismatch``."""
    real_run = read_run(real_run_dir)
    real_summary = real_run.summary
    if real_summary.get("mode") != "real":
        raise ValueError(f"{real_run_dir}: mode is {real_summary.get('mode')!r}; --real-run needs a real run")
    executor = real_summary.get("config", {}).get("executor", {})
    chosen = profile is None
    if chosen:
        profile = default_profile_for(executor)
    model = CalibratedCostModel.from_file(profile)
    notes = check_profile_fits(model.profile.provenance, executor, profile, allow_mismatch=allow_profile_mismatch)
    recorded_workload = load_workload(real_summary["config"]["workload"])
    if recorded_workload.lora_sections():
        if chosen and not model.profile.prices_lora:
            refuse_lora_without_profile(recorded_workload, None)
        notes += check_profile_prices_lora(model.profile, str(profile), recorded_workload.lora_sections()[0][0],
                                           recorded_workload)
    speed = probed_speed(model, real_run_dir)
    applied = at_probed_speed and speed is not None
    if at_probed_speed and not applied:
        notes.append(f"--at-probed-speed: {probe_missing_reason(profile, real_run_dir)}, so the simulation runs at "
                     "the profile's own speed")
    sim_summary = simulate_like(real_run, model, out_dir / "sim",
                                speed_factor=speed["speed_factor"] if applied else 1.0)
    comparison = compare_runs(sim_summary, real_summary)
    comparison["profile"] = str(profile)
    comparison["profile_chosen"] = chosen  # True: no --profile was given, this one fits the run best
    comparison["warnings"] = notes
    comparison["real_run"] = str(real_run_dir)
    # The step-level error under the latency errors (sim/step_time_error.py), at the profile's speed.
    comparison["step_time_error"] = step_time_error(model, real_run.steps)
    # A diagnosis, not a prediction: simulated at the speed of the run's own steps (their measured total),
    # what error is left is the model's and the queues', not the machine's drift.
    own_speed = 1 / (1 + comparison["step_time_error"]["total"])
    at_run_speed = simulate_like(real_run, model, out_dir / "sim-at-run-speed", speed_factor=own_speed)
    comparison["at_run_speed"] = {"speed_factor": own_speed,
                                  "metrics": compare_runs(at_run_speed, real_summary)["metrics"]}
    if speed is not None:
        # What the probe's speed left of the step-time error: how well it caught the run's own speed.
        speed["residual_step_time_error"] = (1 + comparison["step_time_error"]["total"]) * speed["speed_factor"] - 1
        comparison["machine_speed"] = dict(speed, applied=applied)
    if applied:
        at_profile_speed = simulate_like(real_run, model, out_dir / "sim-at-profile-speed")
        comparison["at_profile_speed"] = {"metrics": compare_runs(at_profile_speed, real_summary)["metrics"]}
    elif (out_dir / "sim-at-profile-speed").is_dir():
        shutil.rmtree(out_dir / "sim-at-profile-speed")  # an earlier --at-probed-speed's, not this comparison's
    if sensitivity:
        comparison["sensitivity_per_percent"] = step_time_sensitivity(
            real_run, model, out_dir, sim_summary, speed["speed_factor"] if applied else 1.0)
        # How well the profile's calibration recordings pin its speed down (None with one recording).
        comparison["profile_speed_standard_error"] = speed_standard_error(
            model.profile.provenance.get("recording_errors", {}))
    if "cost_model_extrapolation" in sim_summary:
        comparison["cost_model_extrapolation"] = sim_summary["cost_model_extrapolation"]
    if workload_path is not None:
        comparison["workload"] = str(workload_path)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "comparison.json").write_text(json.dumps(comparison, indent=2) + "\n")
    return comparison


def probe_missing_reason(profile: Path, real_run_dir: Path) -> str:
    if read_probe(real_run_dir) is None:
        return f"{real_run_dir} was recorded without a speed probe (sim.run --speed-probe records one)"
    return f"the profile {profile} has no speed-probe reference (none of its calibration runs had a probe)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.validate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workload", nargs="?",
                        help="a workload YAML file or the name of a shipped example (e.g. cpu_chat)")
    parser.add_argument("--real-run", type=Path, metavar="RUN_DIR",
                        help="compare with this recorded real run instead of running the workload (no model needed)")
    parser.add_argument("--profile", type=Path, default=None,
                        help="calibrated step profile (default: the shipped profile fitted on the run's kind of "
                             "device, model and dtype, from sim/data/profiles/)")
    parser.add_argument("--allow-profile-mismatch", action="store_true",
                        help="compare even with a profile fitted on another kind of device (a CPU profile for a "
                             "GPU run); refused otherwise")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE")
    parser.add_argument("--model", default=None,
                        help="'tiny', 'small' (default), 'tiny-llava', 'small-llava' (a workload with images on a "
                             "generated LLaVA defaults to it) or a checkpoint folder")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    parser.add_argument("--attention-backend", default=None, help="torch, flash_attn or triton")
    parser.add_argument("--enforce-eager", action="store_true", help="on CUDA: no CUDA graphs for decode steps")
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--repeats", type=positive_int, default=1,
                        help="record the workload this many times and compare with their mean too")
    parser.add_argument("--out", type=Path, help="output directory (default: runs/validate-<name>)")
    parser.add_argument("--speed-probe", action="store_true",
                        help="time a fixed probe before and after each recording (sim/speed_probe.py)")
    parser.add_argument("--at-probed-speed", action="store_true",
                        help="simulate at the machine's speed the run's probe measured, not the profile's")
    parser.add_argument("--no-dashboard", action="store_true")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    console = Console()
    if args.workload is None and args.real_run is None:
        parser.error("give a workload to run for real, or --real-run RUN_DIR to compare with a recorded run")
    if args.workload is not None and args.real_run is not None:
        parser.error(f"give a workload ({args.workload!r}) or --real-run RUN_DIR ({str(args.real_run)!r}), not both")
    if args.real_run is not None:
        # The recorded run's engine, model and request stream are fixed: these would change nothing.
        ignored = flags_given(parser, args, RECORDING_FLAGS)
        if ignored:
            parser.error(f"{', '.join(ignored)}: {'apply' if len(ignored) > 1 else 'applies'} to recording a "
                         f"workload; --real-run compares with a recorded run, whose configuration is fixed")
    check_output_directory(parser, "--out", args.out)
    try:
        if args.real_run is not None:
            out_dir = args.out or Path("runs") / f"validate-{args.real_run.name}"
            comparison = validate_recorded(args.real_run, out_dir, profile=args.profile,
                                           at_probed_speed=args.at_probed_speed,
                                           allow_profile_mismatch=args.allow_profile_mismatch)
            real_dir = args.real_run
        else:
            from sim.run import resolve_workload_path

            args.workload = resolve_workload_path(args.workload)
            name = load_workload(args.workload, overrides=args.overrides).name
            out_dir = args.out or Path("runs") / f"validate-{name}"
            comparison = validate(args.workload, out_dir, profile=args.profile, overrides=args.overrides,
                                  model=args.model, device=args.device, threads=args.threads,
                                  progress=not args.no_progress, dtype=args.dtype,
                                  attention_backend=args.attention_backend, enforce_eager=args.enforce_eager,
                                  repeats=args.repeats, speed_probe=args.speed_probe,
                                  at_probed_speed=args.at_probed_speed,
                                  allow_profile_mismatch=args.allow_profile_mismatch)
            real_dir = out_dir / "real"
    except (WorkloadError, ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as error:
        return exit_for_missing_extra(error, "recording a workload for sim.validate")
    if comparison["profile_chosen"]:
        console.print(f"profile: {escape(Path(comparison['profile']).name)} (no --profile given: the shipped profile "
                      "fitted on the run's kind of device, model and dtype)")
    for note in comparison["warnings"]:
        print_warning(note)
    print_fidelity_report(comparison, console=console, tolerance=0.05)
    console.print(describe_headline_error(comparison))
    speed_note = describe_machine_speed(comparison)
    if speed_note:
        console.print(speed_note)
    if "sensitivity_per_percent" in comparison:
        console.print(describe_sensitivity(comparison["sensitivity_per_percent"],
                                           comparison["profile_speed_standard_error"]))
    own = comparison["at_run_speed"]
    console.print(f"diagnosis: simulated at the run's own speed (its steps' measured total, {own['speed_factor'] - 1:+.1%}; "
                  f"not a prediction) the largest headline error is {headline_error(own):.1%}; what separates it "
                  "from the headline is the machine's speed during the run")
    if "repeats" in comparison:
        repeated = comparison["repeats"]
        spread = max(abs(repeated["real_spread_about_mean"][key] or 0.0) for key in HEADLINE_METRICS)
        console.print(f"over {len(repeated['real_runs'])} recordings: largest headline error against each "
                      + ", ".join(f"{error:.1%}" for error in repeated["worst_headline_error_each"])
                      + f"; against their mean {headline_error({'metrics': repeated['vs_mean']}):.1%}; "
                      f"the recordings themselves lie up to {spread:.1%} from their mean (standard error of "
                      f"the mean up to {max(repeated['mean_standard_error'][key] or 0.0 for key in HEADLINE_METRICS):.1%})")
    step_note = describe_step_time_error(comparison["step_time_error"])
    if step_note:
        console.print(step_note)
        console.print(step_kind_table(comparison["step_time_error"].get("by_kind", [])))
    note = describe_extrapolation(comparison["cost_model_extrapolation"]) \
        if "cost_model_extrapolation" in comparison else None
    if note:
        console.print(f"[yellow]note:[/yellow] {note}")
    real_dirs = [Path(path) for path in comparison.get("repeats", {}).get("real_runs", [real_dir])]
    for path in real_dirs:
        # A recording made beside other work is slower than the profile's machine, or time-shared.
        load_note = busy_machine_warning(read_run(path).summary.get("machine_load"), str(path))
        if load_note:
            console.print(f"[yellow]note:[/yellow] {escape(load_note)}")
    if not args.no_dashboard:
        from analysis.dashboard import build_dashboard

        build_dashboard([*real_dirs, out_dir / "sim"], out_dir / "dashboard.html")
    console.print(f"written to {out_dir}/ ({'' if args.real_run else 'real/, '}sim/, comparison.json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
