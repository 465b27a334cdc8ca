"""The machine's speed at the time of a real run, measured by a fixed probe before and after it.

On a shared CPU the same engine step takes a few percent more or less time from one quarter of an
hour to the next (other tenants of the host share its caches and memory bandwidth): the shipped
recordings of one workload, minutes apart, differ by 2-6% in total step time, and a loaded queue
turns that into 10-20% of latency. A step-time profile is fitted at one speed; a simulation compared
with a run recorded at another is off by the difference, whatever the model.

The probe is a fixed set of engine steps (a long prefill, small prefills, decode batches of 1, 4, 16
and 32 requests) that a real run executes on its own engine before its first request and after its
last, twice each, with the prefix cache emptied around them so that the workload starts from a fresh
engine's state. The run directory keeps the probe's steps (``speed_probe.parquet``, the step-trace
columns plus ``phase``). Any profile can then time them: measured over predicted total is the speed
of the machine during the run relative to the profile. ``sim.calibrate`` stores the same ratio for
its own recordings (``provenance.speed_probe``), corrected to the speed the profile was fitted at;
``sim.validate`` divides the two and reports the machine's speed, and with ``--at-probed-speed``
scales the simulated step times by it. The probe never reads the workload's own steps, so such a
simulation stays a prediction.

Measured on the shipped CPU runs (three sets recorded with probes), the probe catches a run's own
speed within about 2%: the machine's speed wanders on a scale of tens of seconds, so 15 s at either
end of a three-minute run sample it only roughly. That is no better than the drift it is meant to
remove: at the probed speed the simulation came closer on 6 of the 12 recordings, so it is not the
default. Recording it is opt-in (``--speed-probe``).

Invariants: the probe leaves no request and no KV block behind (it raises if the prefix cache cannot
be emptied), and its steps fit every shipped engine configuration (at most 500 tokens and 32 requests
per step) so that the same steps are timed wherever it runs.
"""

from __future__ import annotations

from array import array
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from analysis.run_dir import PARQUET_COMPRESSION
from analysis.trace_schema import steps_table
from engine.core import EngineCore
from sim.real_engine import empty_prefix_cache
from sim.wall_clock_driver import run_wall_clock
from workloads import RequestSpec

PROBE_FILE = "speed_probe.parquet"
# (requests, prompt tokens, output tokens) of each wave; a wave starts when the previous one finished.
PROBE_WAVES = ((1, 500, 8), (16, 24, 32), (4, 120, 16), (32, 12, 24))
PROBE_ROUNDS = 2
PHASES = ("before", "after")


def probe_waves(vocab_size: int, reserved_token_ids=(), round_index: int = 0, phase: str = "before",
                max_model_len: int | None = None) -> list[list[RequestSpec]]:
    """The probe's requests, wave by wave: the same token ids every time (a fixed generator), never a
    reserved id, all arriving at once; prompts cut to fit ``max_model_len`` with their output."""
    reserved = set(int(token) for token in reserved_token_ids)
    allowed = np.array([token for token in range(vocab_size) if token not in reserved], dtype=np.int64)
    generator = np.random.default_rng(20261130)
    waves = []
    for wave_index, (num_requests, prompt_len, output_len) in enumerate(PROBE_WAVES):
        if max_model_len is not None:
            prompt_len = max(1, min(prompt_len, max_model_len - output_len))
        wave = []
        for index in range(num_requests):
            tokens = allowed[generator.integers(0, len(allowed), prompt_len)]
            wave.append(RequestSpec(f"probe-{phase}-{round_index}-{wave_index}-{index}", 0.0,
                                    array("q", tokens.tolist()), output_len))
        waves.append(wave)
    return waves


def run_speed_probe(engine: EngineCore, *, vocab_size: int, reserved_token_ids=(), phase: str = "before") -> pd.DataFrame:
    """Run the probe on an idle engine; return its steps (the step-trace columns, ``phase``, ``round``)."""
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
    if engine.has_work():
        raise RuntimeError("the speed probe needs an idle engine")
    scheduler = engine.scheduler
    preemptions = scheduler.num_preemptions_total
    frames = []
    for round_index in range(PROBE_ROUNDS):
        empty_prefix_cache(engine, "the speed probe")  # the second round must not hit the first's prompts
        for wave in probe_waves(vocab_size, reserved_token_ids, round_index, phase,
                                max_model_len=scheduler.max_model_len):
            recorder = run_wall_clock(engine, wave, record_schedule=False)
            frames.append(steps_table(recorder.step_columns()).to_pandas().assign(phase=phase, round=round_index))
    empty_prefix_cache(engine, "the speed probe")  # its cache hits are not the workload's
    scheduler.num_preemptions_total = preemptions
    return pd.concat(frames, ignore_index=True)


def write_probe(run_dir: str | Path, probe_steps: pd.DataFrame) -> None:
    table = pa.Table.from_pandas(probe_steps, preserve_index=False)
    pq.write_table(table, Path(run_dir) / PROBE_FILE, compression=PARQUET_COMPRESSION)


def read_probe(run_dir: str | Path) -> pd.DataFrame | None:
    """The probe steps a real run recorded, or None for a run recorded without a probe."""
    path = Path(run_dir) / PROBE_FILE
    return pq.read_table(path).to_pandas() if path.is_file() else None


def probe_ratio(model, probe_steps: pd.DataFrame) -> float:
    """Measured over predicted total time of the probe's steps: above 1, the machine ran slower than
    ``model`` predicts."""
    from sim.step_time_error import predicted_step_times

    predicted, features = predicted_step_times(model, probe_steps)
    return float(features["duration"].sum() / predicted.sum())


def calibration_reference(predict, run_dirs, measured_over_predicted: dict[str, float]) -> dict | None:
    """``provenance.speed_probe`` of a profile fitted on ``run_dirs``: for each run that recorded a probe,
    the probe's measured over predicted time divided by the run's own (``measured_over_predicted``, the
    machine's speed during that run relative to the fit); their mean is what the probe measures at the
    profile's speed. ``predict``: the fit's step times for a feature table. None when no run has a probe."""
    from sim.calibration_fit import step_feature_frame

    by_run = {}
    for run_dir in run_dirs:
        probe = read_probe(run_dir)
        if probe is None:
            continue
        features = step_feature_frame(probe)
        ratio = features["duration"].sum() / predict(features).sum()
        by_run[str(run_dir)] = float(ratio / measured_over_predicted[str(run_dir)])
    if not by_run:
        return None
    return {"reference_ratio": float(np.mean(list(by_run.values()))), "by_run": by_run}


def probed_speed(model, run_dir: str | Path) -> dict | None:
    """The machine's speed during a recorded run relative to ``model``'s profile: ``speed_factor`` (1.03:
    steps took 3% longer than at the profile's speed), from the run's probe and the profile's reference;
    also per phase (before and after the run). None without a probe or a reference."""
    from sim.cost_models import CalibratedCostModel

    reference = model.profile.provenance.get("speed_probe")
    probe = read_probe(run_dir)
    if not reference or probe is None:
        return None
    at_profile_speed = CalibratedCostModel(model.profile)
    reference_ratio = float(reference["reference_ratio"])
    return {"speed_factor": probe_ratio(at_profile_speed, probe) / reference_ratio,
            "reference_ratio": reference_ratio,
            "by_phase": {str(phase): probe_ratio(at_profile_speed, part) / reference_ratio
                         for phase, part in probe.groupby("phase", sort=False)}}


def probe_summary(probe_steps: pd.DataFrame) -> dict:
    """The probe's size and measured time per phase, for summary.json."""
    return {phase: {"steps": int(len(part)), "measured_s": float(part["duration"].sum())}
            for phase, part in probe_steps.groupby("phase", sort=False)}


__all__ = ["PROBE_FILE", "PROBE_WAVES", "calibration_reference", "probe_ratio", "probed_speed", "probe_summary", "probe_waves", "read_probe",
           "run_speed_probe", "write_probe"]
