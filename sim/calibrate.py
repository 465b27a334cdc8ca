"""Fit a step-time profile from real runs: ``python -m sim.calibrate RUN_DIR [RUN_DIR ...] -o profile.json``.

Reads each run's ``steps.parquet``, fits step duration from the step's features (non-negative least
squares, with hinge terms on the token count when they win on held-out steps), prints the
coefficients and the error on held-out steps, and writes a profile that ``sim.run --cost-model`` reads.
The profile records where it came from: hardware, model, dtype, attention backend, software versions
and the source runs.

Runs of a LoRA workload add the adapters' terms (sim/calibration_fit.py's LORA_FEATURE_SETS, fitted on what
each step's duration leaves after its recorded loads) and the loads' own costs (sim/lora_load_fit.py), and
the profile records the adapters' shape and ``max_lora_rank`` it was measured with (provenance ``lora``).
Base-model runs may be fitted with them; LoRA runs must share one adapter shape and one ``max_lora_rank``.

Runs that speculate with n-gram lookups add the verification terms (SPEC_FEATURE_SETS: per draft row, and per
query-key pair a draft row scores) and the lookups' own cost per request that sampled, which the profile keeps as
``ngram_lookup_s`` (provenance ``speculative_decoding``). Plain runs may be fitted with them; runs that draft with
a model or a head are refused.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import warnings
from pathlib import Path

import pandas as pd

from analysis import read_run
from sim.calibration_fit import FitResult, fit_step_model, step_feature_frame
from sim.lora_adapters import adapter_bytes
from sim.lora_load_fit import fit_load_costs
from sim.model_presets import resolve_model
from workloads import load_workload
from sim.cli_support import check_output_file, open_fraction, print_warning, warnings_as_lines
from sim.cost_models import make_provenance, save_profile
from sim.cost_models.calibrated import ENCODER_FEATURES, LORA_FEATURES, SPEC_FEATURES
from sim.cost_models.calibrated_range import calibrated_range
from sim.machine_load import busy_machine_warning
from sim.recording_speeds import fit_with_recording_speeds
from sim.speed_probe import calibration_reference

# Recordings whose total step time the joint fit misses by more than this apart (max - min) draw a
# warning: on a shared machine the same schedule ran ~8% slower in one half hour than in the next.
RECORDING_SPREAD_WARNING = 0.03


def recording_lora(run, run_dir: Path) -> dict | None:
    """A LoRA run's adapters as calibration needs them (None for a base-model run): the slots' rank, the
    adapters' ranks and modules, and the bytes of one adapter on the run's model (their mean, if they differ)."""
    config = run.summary.get("config", {})
    if "num_lora_tokens" not in run.steps.columns or "workload" not in config:
        return None
    workload = load_workload(config["workload"])
    adapters = list(workload.lora_adapters().values())
    if not adapters:
        return None
    executor = config.get("executor", {})
    model = resolve_model(workload.model)
    if executor.get("model") not in (None, model.name):
        model_path = executor.get("model_path")
        if not model_path or not Path(model_path).is_dir():
            raise ValueError(f"{run_dir}: its workload names model {workload.model!r} but it ran "
                             f"{executor.get('model')!r}, whose checkpoint is not here: the adapters' bytes are unknown")
        model = resolve_model(model_path)
    dtype = executor.get("dtype") or workload.dtype
    sizes = [adapter_bytes(model, adapter, dtype) for adapter in adapters]
    return {"max_lora_rank": workload.engine.max_lora_rank,
            "adapter_ranks": sorted({adapter.rank for adapter in adapters}),
            "target_modules": list(adapters[0].target_modules), "adapter_bytes": sum(sizes) / len(sizes)}


def lora_shape(loras: list[dict | None], run_dirs: list[Path]) -> dict | None:
    """The one adapter shape and slot rank the LoRA runs share (None without LoRA runs); differing ones are named."""
    shapes = {str(run): {key: lora[key] for key in ("max_lora_rank", "adapter_ranks", "target_modules")}
              for run, lora in zip(run_dirs, loras) if lora is not None}
    if not shapes:
        return None
    if len({repr(shape) for shape in shapes.values()}) > 1:
        raise ValueError(f"the LoRA runs differ in max_lora_rank, adapter ranks or target modules ({shapes}): their "
                         "adapter terms are per token of one adapter shape; fit one profile per shape")
    return dict(next(iter(shapes.values())), adapter_bytes=next(lora for lora in loras if lora)["adapter_bytes"])


def recording_images(run_dirs: list[Path]) -> dict | None:
    """What the encoder's terms were measured with (None: no recording has images): the model's tokens per image,
    which every recording with images must share (a profile prices images of that size only)."""
    sizes = {}
    for run_dir in run_dirs:
        config = json.loads((Path(run_dir) / "summary.json").read_text()).get("config", {})
        if config.get("tokens_per_image"):
            sizes[str(run_dir)] = int(config["tokens_per_image"])
    if not sizes:
        return None
    if len(set(sizes.values())) > 1:
        raise ValueError(f"the recordings with images differ in tokens per image ({sizes}): calibrate each model apart")
    return {"tokens_per_image": next(iter(sizes.values()))}


def recording_speculation(run, run_dir: Path) -> dict | None:
    """A speculating run's proposer as calibration needs it (None for a run that does not speculate): its method,
    which must be ngram (a draft model's or head's passes are a network of their own, which this fit has no
    terms for), and its drafts per step."""
    section = (run.summary.get("config", {}).get("workload", {}).get("engine", {}) or {}).get("speculative_decoding")
    if not section or not section.get("num_speculative_tokens"):
        return None
    method = section.get("method", "ngram")
    if method != "ngram":
        raise ValueError(f"{run_dir}: engine.speculative_decoding.method {method!r}: calibration prices n-gram "
                         "lookups only (a draft model's or head's passes would need terms of their own); calibrate "
                         "on runs that speculate with method ngram, or without speculation")
    return {"method": method, "num_speculative_tokens": int(section["num_speculative_tokens"])}


def load_steps(run_dirs: list[Path]) -> tuple[pd.DataFrame, dict, dict | None]:
    """The feature table of every run's steps, the runs' executor, and the shape of their adapters (None
    without LoRA runs; the table then has an ``adapter_bytes`` column for the loads' fit)."""
    frames, executors, loras = [], [], []
    for run_dir in run_dirs:
        run = read_run(run_dir)
        if run.summary.get("mode") != "real":
            raise ValueError(f"{run_dir}: mode is {run.summary.get('mode')!r}; calibrate from real runs")
        lora = recording_lora(run, run_dir)
        loras.append(lora)
        speculation = recording_speculation(run, run_dir)
        frame = step_feature_frame(run.steps, ngram_lookups=speculation is not None).assign(
            recording=len(frames), speculative_tokens=speculation["num_speculative_tokens"] if speculation else 0)
        frames.append(frame if lora is None else frame.assign(adapter_bytes=lora["adapter_bytes"]))
        executors.append(run.summary.get("config", {}).get("executor", {}))
        warning = busy_machine_warning(run.summary.get("machine_load"), str(run_dir))
        if warning:
            warnings.warn(warning, stacklevel=2)
    identities = {(e.get("model"), e.get("device"), e.get("dtype"), e.get("attention_backend")) for e in executors}
    if len(identities) > 1:
        raise ValueError(f"the runs come from different executors {sorted(map(str, identities))}: "
                         "fit one profile per model, device, dtype and backend")
    return pd.concat(frames, ignore_index=True), executors[0], lora_shape(loras, run_dirs)


def calibrate(run_dirs: list[Path], output: Path, *, held_out_fraction: float = 0.2, seed: int = 0,
              fixed: dict[str, float] | None = None, speed_per_recording: bool = False,
              speed_level: list[Path] | None = None) -> FitResult:
    """``speed_per_recording``: fit each recording's speed beside the model (sim/recording_speeds.py), the
    level set by the ``speed_level`` recordings (a subset of ``run_dirs``; default all of them)."""
    if speed_level and not speed_per_recording:
        raise ValueError("--speed-level sets the level of a fit with --speed-per-recording; add that flag")
    features, executor, lora = load_steps(run_dirs)
    speeds = None
    if speed_per_recording:
        fit, speeds = fit_with_recording_speeds(features, level_indexes(run_dirs, speed_level),
                                                held_out_fraction=held_out_fraction, seed=seed, fixed=fixed)
    else:
        fit = fit_step_model(features, held_out_fraction=held_out_fraction, seed=seed, fixed=fixed)
    provenance = make_provenance(
        hardware=str(executor.get("hardware", "unknown")), model=str(executor.get("model", "unknown")),
        dtype=str(executor.get("dtype", "unknown")), attention_backend=executor.get("attention_backend"),
        device=executor.get("device"), source_runs=[str(path) for path in run_dirs], fit_error=fit.error_summary())
    provenance["num_steps"] = int(len(features))
    if fixed:
        provenance["fixed_coefficients"] = dict(fixed)  # taken as given, not fitted
    provenance["recording_errors"] = recording_errors(fit, features, run_dirs)
    if speeds is not None:  # each recording's speed relative to the profile's (1.05: its steps took 5% longer)
        provenance["recording_speeds"] = {str(run): float(speed) for run, speed in zip(run_dirs, speeds)}
        provenance["speed_level_runs"] = [str(run) for run in (speed_level or run_dirs)]
    # What the speed probe measures at the profile's speed, for runs that recorded one (speed_probe.py).
    reference = calibration_reference(fit.predict, run_dirs, {run: 1 / (1 + error) for run, error
                                                              in provenance["recording_errors"].items()})
    if reference is not None:
        provenance["speed_probe"] = reference
    # The region the fit saw: simulated runs that leave it are told so (calibrated_range.py).
    provenance["calibrated_range"] = calibrated_range(features)
    # How the measured runs were made (their torch version, CUDA graphs on or off, threads, ...).
    provenance["executor"] = {key: value for key, value in executor.items() if key != "model_path"}
    load_fit = None
    if lora is not None:
        # What the adapters' terms were measured with (sim.run and sim.validate check a LoRA workload against it).
        load_fit = fit_load_costs(features[features["adapter_bytes"].notna()], seed=seed)
        provenance["lora"] = dict(lora, compute_terms=[name for name in fit.coefficients if name in LORA_FEATURES],
                                  held_out_median_ape_by_terms=fit.lora_feature_errors,
                                  loads=None if load_fit is None else load_fit.summary())
    images = recording_images(run_dirs)
    if images is not None and fit.encoder_feature_errors:
        # What sim.run and sim.validate check a workload with images against (sim/vision_setup.py).
        terms = [name for name in fit.coefficients if name in ENCODER_FEATURES]
        provenance["images"] = dict(images, compute_terms=terms,
                                    held_out_median_ape_by_terms=fit.encoder_feature_errors,
                                    num_held_out_encoder_steps=fit.num_held_out_encoder_steps)
    coefficients, ngram_lookup_s = dict(fit.coefficients), None
    if fit.spec_feature_errors:
        # The lookups run after the pass, per request that sampled: the simulator adds them to a speculating step
        # (sim/speculation.py), so they are the profile's own key, not a step feature.
        ngram_lookup_s = coefficients.pop("ngram_lookups")
        provenance["speculative_decoding"] = {
            "method": "ngram", "compute_terms": [name for name in fit.coefficients if name in SPEC_FEATURES],
            "held_out_median_ape_by_terms": fit.spec_feature_errors,
            "num_held_out_spec_steps": fit.num_held_out_spec_steps,
            "num_speculative_tokens": sorted(int(k) for k in set(features["speculative_tokens"]) if k)}
    save_profile(output, coefficients, fit.intercept_s, provenance, kind=fit.kind,
                 hinges=fit.hinges if fit.kind == "piecewise_linear" else None,
                 token_count_offsets_s=fit.token_count_offsets_s,
                 lora_loads=None if load_fit is None else load_fit.costs.to_dict(), ngram_lookup_s=ngram_lookup_s)
    return fit


def describe_lora_fit(lora: dict, loads: dict | None) -> str:
    """What the fit learned of the adapters: which compute terms won on held-out steps, and the loads' costs."""
    tried = ", ".join(f"{terms} {error:.2%}" for terms, error in lora["held_out_median_ape_by_terms"].items())
    lines = [f"  LoRA (max_lora_rank {lora['max_lora_rank']}, adapter ranks {lora['adapter_ranks']}, "
             f"{lora['adapter_bytes'] / 1e6:.2f} MB an adapter): kept {' + '.join(lora['compute_terms'])}; held-out "
             f"steps with adapters, median |error| by terms tried: {tried}"]
    if loads is None:
        lines.append("  no step loaded an adapter: the simulator prices loads from the hardware's bandwidths")
    else:
        fitted = lora["loads"]
        errors = ", ".join(f"{kind} {error:.1%}" for kind, error in fitted["median_ape_by_kind"].items())
        lines.append(f"  adapter loads ({fitted['num_load_steps']} steps, {fitted['num_held_out_load_steps']} held out): "
                     f"{loads['kind']}, copy {describe_load_cost(loads['kind'], loads['copy_s'])}, disk read "
                     f"{describe_load_cost(loads['kind'], loads['disk_read_s'])}; median |error| {errors}")
    return "\n".join(lines)


def describe_load_cost(kind: str, seconds: float) -> str:
    """A fitted load cost for a person: a bandwidth for seconds per byte, milliseconds for seconds per load."""
    if kind == "per_load":
        return f"{seconds * 1e3:.3g} ms a load"
    return f"{1e-9 / seconds:.3g} GB/s" if seconds else "free (no such load recorded)"


def level_indexes(run_dirs: list[Path], speed_level: list[Path] | None) -> list[int] | None:
    """The positions of the ``speed_level`` runs among ``run_dirs`` (None: all); one not among them is named."""
    if not speed_level:
        return None
    resolved = [path.resolve() for path in run_dirs]
    missing = [str(path) for path in speed_level if path.resolve() not in resolved]
    if missing:
        raise ValueError(f"--speed-level {', '.join(missing)}: not among the run directories being fitted")
    return [resolved.index(path.resolve()) for path in speed_level]


def recording_errors(fit: FitResult, features: pd.DataFrame, run_dirs: list[Path]) -> dict[str, float]:
    """Per calibration run, the fit's error on the total time of its steps, (predicted - measured) /
    measured. Recordings of one workload that the same fit misses in opposite directions ran at
    different machine speeds; a profile fitted on them predicts their average."""
    predicted = fit.predict(features)
    errors = {}
    for index, run_dir in enumerate(run_dirs):
        selected = (features["recording"] == index).to_numpy()
        measured = features["duration"].to_numpy()[selected].sum()
        errors[str(run_dir)] = float(predicted[selected].sum() / measured - 1)
    return errors


def speed_standard_error(errors: dict[str, float]) -> float | None:
    """How well the recordings pin the profile's speed down: the standard error of their mean total-time
    error (sample standard deviation / sqrt(n)); None with fewer than two. The machine's drift between
    recordings makes each one a sample of its speed; a simulation's latency is uncertain by this times
    its gain (``sim.validate``'s sensitivity line) before any error of the model's own."""
    if len(errors) < 2:
        return None
    return statistics.stdev(errors.values()) / len(errors) ** 0.5


def recording_spread_warning(errors: dict[str, float]) -> str | None:
    if len(errors) < 2 or max(errors.values()) - min(errors.values()) <= RECORDING_SPREAD_WARNING:
        return None
    slowest, fastest = min(errors, key=errors.get), max(errors, key=errors.get)
    return (f"the fit times {slowest} {errors[slowest]:+.1%} and {fastest} {errors[fastest]:+.1%} in total: the "
            "recordings ran at different speeds (a shared machine drifts), so the profile predicts their average. "
            "Record more, at different times, and fit on all of them")


def parse_fixed(pairs: list[str]) -> dict[str, float]:
    """``["kv_block_runs=1.18e-5", ...]`` -> ``{"kv_block_runs": 1.18e-05}``; a bad pair is named."""
    fixed = {}
    for pair in pairs:
        name, separator, value = pair.partition("=")
        try:
            if not separator:
                raise ValueError
            fixed[name.strip()] = float(value)
        except ValueError:
            raise ValueError(f"--fix: expected FEATURE=SECONDS, got {pair!r}") from None
    return fixed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.calibrate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", type=Path, help="real run directories (sim.run --executor real)")
    parser.add_argument("-o", "--output", type=Path, required=True, help="the profile to write (.json)")
    parser.add_argument("--held-out", type=open_fraction, default=0.2,
                        help="fraction of steps held out of the fit, between 0 and 1 (default 0.2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fix", action="append", default=[], metavar="FEATURE=SECONDS",
                        help="take this coefficient as given (seconds per unit, e.g. from a microbenchmark) "
                             "and fit the rest; for costs the runs hardly vary apart (repeatable)")
    parser.add_argument("--speed-per-recording", action="store_true",
                        help="fit one speed per recording beside the model, so that a machine's drift between "
                             "recordings is not learned as the cost of whatever those recordings ran more of")
    parser.add_argument("--speed-level", action="extend", nargs="+", type=Path, default=[], metavar="RUN_DIR",
                        help="with --speed-per-recording: the recordings whose machine speed the profile takes "
                             "(one or more, or the flag repeated; default all)")
    args = parser.parse_args(argv)
    check_output_file(parser, "-o/--output", args.output, "profile.json")
    try:
        fixed = parse_fixed(args.fix)
        with warnings_as_lines():  # a busy machine's recordings: one "warning: ..." line each
            fit = calibrate(args.run_dirs, args.output, held_out_fraction=args.held_out, seed=args.seed, fixed=fixed,
                            speed_per_recording=args.speed_per_recording, speed_level=args.speed_level)
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"{fit.kind} step-time model, fixed cost {fit.intercept_s * 1e3:.3f} ms per step:")
    for name, value in fit.coefficients.items():
        print(f"  {name:>24}: {value * 1e6:12.4f} us per unit" + (" (fixed)" if name in fixed else ""))
    for hinge in fit.hinges:
        print(f"  {hinge['feature']:>14} above {hinge['knot']:>7.0f}: {hinge['coefficient'] * 1e6:12.4f} us per unit")
    for count, offset in fit.token_count_offsets_s.items():
        print(f"  {'steps of ' + str(count) + ' token(s)':>24}: {offset * 1e3:+12.4f} ms")
    errors = fit.error_summary()
    print(f"held-out steps: {errors['num_held_out_steps']}, median |error| {errors['median_ape']:.2%}, "
          f"p90 {errors['p90_ape']:.2%} (train median {errors['train_median_ape']:.2%})")
    kinds = [f"{label} {errors[key + '_median_ape']:.2%} ({errors['num_' + key + '_steps']} steps)"
             for key, label in (("decode_only", "decode-only"), ("with_prefill", "with a prefill chunk"))
             if key + "_median_ape" in errors]
    if kinds:
        print(f"  median |error| by step: {', '.join(kinds)}; their total time: {errors['total_time_ape']:.2%} off")
    profile = json.loads(args.output.read_text())
    provenance = profile["provenance"]
    if "lora" in provenance:
        print(describe_lora_fit(provenance["lora"], profile.get("lora_loads")))
    if "images" in provenance:
        images = provenance["images"]
        tried = ", ".join(f"{terms} {error:.2%}" for terms, error in images["held_out_median_ape_by_terms"].items())
        print(f"  images ({images['tokens_per_image']} tokens each): kept {' + '.join(images['compute_terms'])}; "
              f"held-out steps that encode one ({images['num_held_out_encoder_steps']}): {tried}")
    if "speculative_decoding" in provenance:
        spec = provenance["speculative_decoding"]
        tried = ", ".join(f"{terms} {error:.2%}" for terms, error in spec["held_out_median_ape_by_terms"].items())
        print(f"  n-gram speculative decoding ({spec['num_speculative_tokens']} drafts): kept "
              f"{' + '.join(spec['compute_terms'])}, an n-gram lookup {profile['ngram_lookup_s'] * 1e6:.1f} us; held-out "
              f"steps of speculating runs ({spec['num_held_out_spec_steps']}), median |error| by terms tried: {tried}")
    errors_by_run = provenance["recording_errors"]
    if "recording_speeds" in provenance:
        # The drift was fitted, not averaged into the costs: say how far each recording ran from the level.
        print("  speed of each recording (its steps' time over the profile's): "
              + ", ".join(f"{Path(run).name} {speed:.3f}" for run, speed in provenance["recording_speeds"].items())
              + f"; the profile's level is the mean of {len(provenance['speed_level_runs'])} of them")
    elif len(errors_by_run) > 1:
        print("  total step time by recording: " + ", ".join(f"{Path(run).name} {error:+.1%}"
                                                           for run, error in errors_by_run.items())
              + f"; the profile's speed is their mean, within {speed_standard_error(errors_by_run):.1%} "
              "(one standard error)")
    warning = None if "recording_speeds" in provenance else recording_spread_warning(errors_by_run)
    if warning:
        print_warning(warning)
    print(f"profile written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
