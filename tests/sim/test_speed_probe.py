"""The speed probe: a fixed set of engine steps that measures the machine's speed of the moment.

No torch here: the probe runs on the scripted executor, and the reference and per-run speed are
checked on synthetic recordings of a known step-time law at known machine speeds.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from analysis import requests_table, steps_table, write_run
from engine.core import CacheConfig, EngineCore, Scheduler, SchedulerConfig, ScriptedExecutor
from sim.calibrate import calibrate
from sim.cost_models import CalibratedCostModel, StepFeatures
from sim.validate import DEFAULT_PROFILE
from sim.speed_probe import PROBE_WAVES, probed_speed, read_probe, run_speed_probe, write_probe
from tests.sim.test_calibration import EXECUTOR, ONE_REQUEST, synthetic_steps


def roomy_engine(num_gpu_blocks=2048, max_num_seqs=64):
    return EngineCore(Scheduler(SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=1024,
                                                max_model_len=4096),
                                CacheConfig(block_size=16, num_gpu_blocks=num_gpu_blocks, enable_prefix_caching=True)),
                      ScriptedExecutor(vocab_size=1000))


def test_the_probe_runs_the_same_steps_every_time_and_leaves_the_engine_as_it_found_it():
    engine = roomy_engine()
    manager = engine.scheduler.kv_cache_manager
    before = run_speed_probe(engine, vocab_size=1000, reserved_token_ids=[0, 1, 2], phase="before")
    after = run_speed_probe(engine, vocab_size=1000, reserved_token_ids=[0, 1, 2], phase="after")
    assert not engine.has_work() and manager.num_free_blocks == manager.num_usable_blocks
    assert engine.scheduler.num_preemptions_total == 0
    assert set(before["phase"]) == {"before"} and set(after["phase"]) == {"after"}
    assert before["num_scheduled_tokens"].tolist() == after["num_scheduled_tokens"].tolist()
    # Two rounds of the same steps: the second round's prompts hit nothing the first one cached.
    first, second = (part for _, part in before.groupby("round"))
    assert first["num_scheduled_tokens"].tolist() == second["num_scheduled_tokens"].tolist()
    assert before["prefix_hit_tokens"].sum() == 0
    # Every step fits the smallest shipped budget (512 tokens, 32 requests), so any of them runs these steps.
    assert before["num_scheduled_tokens"].max() == max(count * prompt for count, prompt, _ in PROBE_WAVES)
    assert before["num_scheduled_tokens"].max() <= 512 and before["num_reqs"].max() <= 32
    assert before["num_scheduled_tokens"].sum() == 2 * sum(count * (prompt + output - 1)
                                                           for count, prompt, output in PROBE_WAVES)


def test_the_probe_runs_on_an_engine_too_small_for_it_and_refuses_a_busy_one():
    small = roomy_engine(num_gpu_blocks=40, max_num_seqs=8)  # preempts inside the probe
    steps = run_speed_probe(small, vocab_size=1000)
    manager = small.scheduler.kv_cache_manager
    assert len(steps) > 0 and manager.num_free_blocks == manager.num_usable_blocks
    assert small.scheduler.num_preemptions_total == 0  # the probe's own preemptions are not the workload's
    with pytest.raises(ValueError, match="phase"):
        run_speed_probe(small, vocab_size=1000, phase="during")


def test_a_speed_factor_scales_every_step_time():
    model = CalibratedCostModel.from_file(DEFAULT_PROFILE)
    slower = CalibratedCostModel(model.profile, speed_factor=1.07)
    features = StepFeatures(num_tokens=300, num_reqs=10, num_prefill_reqs=1, num_prefill_tokens=291, num_decode_reqs=9,
                            prefill_context_tokens=0, prefill_attention_work=291 * 146, max_seq_len=600,
                            decode_context_tokens=4000)
    assert slower.step_time_from_features(features) == pytest.approx(1.07 * model.step_time_from_features(features))
    assert slower.describe()["speed_factor"] == 1.07 and "speed_factor" not in model.describe()
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="speed_factor"):
            CalibratedCostModel(model.profile, speed_factor=bad)


def law_probe(speed: float):
    """Probe steps of the synthetic law (before and after), measured at ``speed`` (1.1: 10% slower)."""
    probe = steps_table(synthetic_steps(num_steps=80, seed=9, noise=0.0)).to_pandas()
    probe["duration"] *= speed
    return probe.assign(phase=np.where(np.arange(80) < 40, "before", "after"), round=0)


def record(path, speed: float, seed: int, probe: bool = True):
    """A synthetic recording of the law at ``speed``, with a probe measured at the same speed."""
    steps = synthetic_steps(seed=seed, noise=0.005)
    write_run(path, requests_table(ONE_REQUEST), steps_table(steps.assign(duration=steps["duration"] * speed)),
              {"name": path.name, "mode": "real", "config": {"executor": EXECUTOR}})
    if probe:
        write_probe(path, law_probe(speed))
    return path


def test_calibration_stores_the_probe_reference_and_a_later_run_is_timed_at_its_own_speed(tmp_path):
    runs = [record(tmp_path / "fast", 1.0, 1), record(tmp_path / "slow", 1.06, 2), record(tmp_path / "old", 1.03, 3, False)]
    calibrate(runs, tmp_path / "profile.json")
    reference = json.loads((tmp_path / "profile.json").read_text())["provenance"]["speed_probe"]
    assert set(reference["by_run"]) == {str(runs[0]), str(runs[1])}  # the run without a probe adds nothing
    model = CalibratedCostModel.from_file(tmp_path / "profile.json")
    # The profile predicts the three recordings' average speed, about 1.03: a run at 1.10 is ~6.8% slower.
    later = record(tmp_path / "later", 1.10, 4)
    speed = probed_speed(model, later)
    assert speed["speed_factor"] == pytest.approx(1.10 / 1.03, rel=0.01)
    assert speed["by_phase"]["before"] == pytest.approx(speed["by_phase"]["after"], rel=0.005)  # one speed
    assert probed_speed(model, record(tmp_path / "unprobed", 1.1, 5, False)) is None
    assert read_probe(tmp_path / "unprobed") is None


def test_a_single_calibration_run_is_timed_exactly_at_its_own_speed(tmp_path):
    """Calibrated on one probed run, the probe's speed for that run is its measured over predicted total,
    exactly: nothing of its own step time is left unexplained."""
    run = record(tmp_path / "only", 1.04, 6)
    calibrate([run], tmp_path / "profile.json")
    profile = json.loads((tmp_path / "profile.json").read_text())
    error = profile["provenance"]["recording_errors"][str(run)]
    speed = probed_speed(CalibratedCostModel.from_file(tmp_path / "profile.json"), run)
    assert speed["speed_factor"] * (1 + error) == pytest.approx(1.0, abs=1e-12)
