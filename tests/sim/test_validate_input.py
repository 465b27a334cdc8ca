"""sim.validate's choice of profile, and what it refuses or warns about: the shipped profile that fits a
recorded run when none is given, a profile for another kind of device refused, other differences and a
missing speed probe warned about, flags that would do nothing refused, stale repeats removed.

Offline: the shipped recordings (sim/data/runs/) and a stand-in for the real run where one is recorded.
"""

import json
import shutil
from pathlib import Path

import pytest

from sim import profile_match
from sim.validate import main as validate_main
from sim.validate import validate

DATA = Path(__file__).resolve().parents[2] / "sim" / "data"
GPU_CHAT = DATA / "runs" / "h200-small-bfloat16" / "gpu-chat"
CPU_CHAT = DATA / "runs" / "cpu-small-float32" / "cpu-chat"
CPU_PROFILE = DATA / "profiles" / "cpu-small-float32.json"
GPU_PROFILE = DATA / "profiles" / "h200-small-bfloat16.json"


def exit_code(argv: list[str]) -> int:
    try:
        return validate_main(argv)
    except SystemExit as exit_info:
        return exit_info.code


def test_without_a_profile_a_gpu_run_is_compared_with_the_gpu_profile(tmp_path, capsys):
    """The CPU profile used to be the default for every run: an H200 run came out 1,000,000% off."""
    assert validate_main(["--real-run", str(GPU_CHAT), "--out", str(tmp_path / "v"), "--no-dashboard"]) == 0
    comparison = json.loads((tmp_path / "v" / "comparison.json").read_text())
    assert Path(comparison["profile"]) == GPU_PROFILE and comparison["profile_chosen"] is True
    assert comparison["warnings"] == []
    assert abs(comparison["metrics"]["ttft_ms.p50"]["relative_error"]) < 0.25
    captured = capsys.readouterr()
    assert "profile: h200-small-bfloat16.json (no --profile given" in " ".join(captured.out.split())
    assert "warning:" not in captured.err


def test_the_default_profile_fits_the_runs_device_kind():
    assert profile_match.default_profile_for({"device": "cuda:0", "hardware": "NVIDIA A100"}) == GPU_PROFILE
    assert profile_match.default_profile_for({"device": "cpu", "hardware": "Intel Xeon (1 thread)"}) == CPU_PROFILE
    with pytest.raises(profile_match.ProfileMismatchError, match="no shipped profile was fitted on device 'xpu'"):
        profile_match.default_profile_for({"device": "xpu"})


def test_a_profile_for_another_kind_of_device_is_refused_unless_allowed(tmp_path, capsys):
    argv = ["--real-run", str(GPU_CHAT), "--profile", str(CPU_PROFILE), "--out", str(tmp_path / "v"), "--no-dashboard"]
    assert exit_code(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert (f"error: --profile: '{CPU_PROFILE}' was fitted on device 'cpu' (AMD EPYC (1 thread)), but the run is on "
            "'cuda' (NVIDIA H200)") in err and "--allow-profile-mismatch" in err and "Traceback" not in err
    assert not (tmp_path / "v").exists()
    assert exit_code([*argv, "--allow-profile-mismatch"]) == 0
    err = capsys.readouterr().err
    assert "warning: --profile:" in err
    assert "warning: the profile was fitted for hardware 'AMD EPYC (1 thread)', but this run used 'NVIDIA H200'" in err


def test_a_profile_fitted_on_other_hardware_of_the_same_kind_is_a_warning(tmp_path, capsys):
    recorded = tmp_path / "cpu-chat"
    shutil.copytree(CPU_CHAT, recorded)
    summary = json.loads((recorded / "summary.json").read_text())
    summary["config"]["executor"]["hardware"] = "Intel Xeon (4 threads)"
    (recorded / "summary.json").write_text(json.dumps(summary))
    assert validate_main(["--real-run", str(recorded), "--out", str(tmp_path / "v"), "--no-dashboard"]) == 0
    assert ("warning: the profile was fitted for hardware 'AMD EPYC (1 thread)', but this run used "
            "'Intel Xeon (4 threads)'") in capsys.readouterr().err


def test_probed_speed_without_a_probe_is_a_warning(tmp_path, capsys):
    assert validate_main(["--real-run", str(GPU_CHAT), "--at-probed-speed", "--out", str(tmp_path / "v"),
                          "--no-dashboard"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert f"warning: --at-probed-speed: {GPU_CHAT} was recorded without a speed probe" in err


@pytest.mark.parametrize("argv,message", [
    (["cpu_chat", "--real-run", str(CPU_CHAT)], f"give a workload ('cpu_chat') or --real-run RUN_DIR ('{CPU_CHAT}'), "
                                                "not both"),
    (["--real-run", str(CPU_CHAT), "--set", "engine.max_num_seqs=2"], "--set: applies to recording a workload; "
                                                                      "--real-run compares with a recorded run"),
    (["--real-run", str(CPU_CHAT), "--device", "cuda", "--speed-probe"], "--device, --speed-probe: apply to recording"),
    (["cpu_chat", "--threads", "0"], "argument --threads: must be an integer >= 1, got 0"),
    (["cpu_chat", "--repeats", "0"], "argument --repeats: must be an integer >= 1, got 0"),
])
def test_flags_that_would_do_nothing_or_are_out_of_range_are_refused(capsys, argv, message):
    assert exit_code(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert message in err and "Traceback" not in err


def test_a_plain_validate_removes_the_repeats_an_earlier_one_left(tmp_path, monkeypatch):
    """After --repeats 3, a plain run into the same directory would leave real-2/ and real-3/ beside its
    new real/, passing for its repeats. The recording itself is stood in for by a shipped run."""
    import sim.real_engine
    import sim.real_run

    monkeypatch.setattr(sim.real_engine, "build_real_engine", lambda workload, **options: _StandIn())
    monkeypatch.setattr(sim.real_run, "run_real", lambda workload, real_dir, *args, **options:
                        shutil.copytree(CPU_CHAT, real_dir, dirs_exist_ok=True))
    out = tmp_path / "v"
    for name in ("real-2", "real-3", "real-notes", "sim-2"):
        (out / name).mkdir(parents=True)
    validate(DATA.parents[1] / "workloads" / "examples" / "cpu_chat.yaml", out, progress=False)
    assert sorted(path.name for path in out.iterdir() if path.name.startswith("real")) == ["real", "real-notes"]
    assert (out / "sim-2").is_dir()  # not a name this tool writes: left alone


class _StandIn:
    """sim/real_engine.py's RealEngine, without a model: its fields, a LoRA workload's two and the images' included."""
    engine, vocab_size, reserved_token_ids, info, lora_paths, lora_manager, images = None, 0, [], {}, {}, None, None


def test_a_speculating_workload_without_a_profile_that_prices_it_is_refused_before_it_is_recorded(tmp_path, monkeypatch):
    """sim.validate compares a speculating run only with a profile fitted on n-gram runs: it says so before recording
    one, not after; with such a profile it records."""
    import sim.real_engine

    def recording(workload, **options):
        raise AssertionError("the workload was recorded before being refused")

    monkeypatch.setattr(sim.real_engine, "build_real_engine", recording)
    workload = DATA.parents[1] / "workloads" / "examples" / "cpu_chat.yaml"
    spec = "engine.speculative_decoding={num_speculative_tokens: 2, acceptance_rate: 0.5}"
    with pytest.raises(ValueError, match="engine.speculative_decoding: num_speculative_tokens 2: a speculating "
                                         "workload is compared by sim.validate only with --profile"):
        validate(workload, tmp_path / "v", overrides=[spec], progress=False)
    assert not (tmp_path / "v").exists()
    from sim.calibrated_speculation import NGRAM_PROFILE

    with pytest.raises(AssertionError, match="recorded before being refused"):
        validate(workload, tmp_path / "n", overrides=[spec], profile=NGRAM_PROFILE, progress=False)
    off = "engine.speculative_decoding={num_speculative_tokens: 0, acceptance_rate: 0.5}"
    with pytest.raises(AssertionError, match="recorded before being refused"):  # 0 drafts: recorded as usual
        validate(workload, tmp_path / "w", overrides=[off], progress=False)
