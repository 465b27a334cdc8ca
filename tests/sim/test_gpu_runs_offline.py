"""The shipped H200 runs, used where no GPU is: the GPU profile is what ``sim.calibrate`` makes of them, and
simulating a recorded GPU run with it stays near the measured run.

The runs were recorded on one H200 (``sim/data/runs/h200-small-bfloat16/README.md``). These tests need no
GPU: calibration and simulation read only the recorded step and request tables.
"""

import json
from pathlib import Path

import pytest

from analysis import compare_runs, read_run
from sim.calibrate import main as calibrate_main
from sim.validate import simulate_like

RUNS = Path(__file__).resolve().parents[2] / "sim" / "data" / "runs" / "h200-small-bfloat16"
PROFILE = Path(__file__).resolve().parents[2] / "sim" / "data" / "profiles" / "h200-small-bfloat16.json"


def test_the_shipped_gpu_profile_is_what_calibrate_fits_on_the_shipped_run(tmp_path):
    out = tmp_path / "profile.json"
    assert calibrate_main([str(RUNS / "gpu-calibrate"), "-o", str(out)]) == 0
    fitted, shipped = json.loads(out.read_text()), json.loads(PROFILE.read_text())
    assert fitted["features"] == shipped["features"]
    assert fitted["coefficients"] == pytest.approx(shipped["coefficients"], rel=1e-6, abs=1e-12)
    assert fitted["intercept_s"] == pytest.approx(shipped["intercept_s"], rel=1e-6)
    assert shipped["provenance"]["hardware"] == "NVIDIA H200"
    assert shipped["provenance"]["attention_backend"] == "triton"


def test_simulating_a_recorded_gpu_run_with_the_gpu_profile(tmp_path):
    """A loose bound: the figures per workload are in the README; this guards the offline pipeline."""
    real = RUNS / "gpu-chat"
    simulated = simulate_like(real, PROFILE, tmp_path / "sim")
    comparison = compare_runs(simulated, read_run(real).summary)
    metrics = comparison["metrics"]
    assert abs(metrics["request_throughput"]["relative_error"]) < 0.03
    for key in ("ttft_ms.p50", "tpot_ms.p50", "e2e_ms.p50"):
        assert abs(metrics[key]["relative_error"]) < 0.25, (key, metrics[key])
