"""Bad input to sim.run, sim.calibrate and sim.retime: one ``error: ...`` line naming the flag and the
value, exit code 2, no traceback; and flags that would do nothing in the mode asked for are refused.

Every case fails before any model runs or any simulation starts (or, for a real run, before the model
loads), so the file stays fast on a small CI machine.
"""

from pathlib import Path

import pytest
import torch

from kernels import triton_support
from sim.calibrate import main as calibrate_main
from sim.retime import main as retime_main
from sim.run import main as run_main

DATA = Path(__file__).resolve().parents[2] / "sim" / "data"
CPU_RUNS = DATA / "runs" / "cpu-small-float32"
CPU_PROFILE = DATA / "profiles" / "cpu-small-float32.json"
SMALL_CHAT = ["chat", "--set", "workload.num_requests=20", "--no-dashboard", "--no-progress", "--quiet"]


def exit_code(main, argv: list[str]) -> int:
    """The CLI's exit code, whether it returns it or argparse exits with it."""
    try:
        return main(argv)
    except SystemExit as exit_info:
        return exit_info.code


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return " ".join(err.split())


@pytest.mark.parametrize("argv,message", [
    (["--threads", "0"], "argument --threads: must be an integer >= 1, got 0"),
    (["--threads", "-3"], "argument --threads: must be an integer >= 1, got -3"),
    (["--device", "gpu"], "error: device must be 'cpu' or 'cuda', got 'gpu'"),
    (["--device", "xyz"], "error: device must be 'cpu' or 'cuda', got 'xyz'"),
])
def test_a_real_run_refuses_bad_engine_flags(tmp_path, capsys, argv, message):
    assert exit_code(run_main, ["cpu_chat", "--executor", "real", "--model", "tiny", "--out", str(tmp_path / "run"),
                                "--no-progress", *argv]) == 2
    assert message in one_line_error(capsys)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_a_real_run_on_cuda_without_cuda_is_a_clear_error(tmp_path, capsys):
    for main, argv in ((run_main, ["cpu_chat", "--executor", "real", "--model", "tiny", "--out", str(tmp_path / "r")]),
                       (retime_main, [str(CPU_RUNS / "cpu-chat"), "--model", "tiny"])):
        assert exit_code(main, [*argv, "--device", "cuda"]) == 2
        assert "error: device 'cuda' was requested but CUDA is not available" in one_line_error(capsys)


def test_an_attention_backend_that_cannot_run_here_is_a_clear_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(triton_support, "triton_unavailable_reason", lambda: "the triton package is not installed")
    for main, argv in ((run_main, ["cpu_chat", "--executor", "real", "--model", "tiny", "--out", str(tmp_path / "r")]),
                       (retime_main, [str(CPU_RUNS / "cpu-chat"), "--model", "tiny"])):
        assert exit_code(main, [*argv, "--attention-backend", "triton"]) == 2
        assert "error: attention_backend 'triton' cannot run here: the triton package" in one_line_error(capsys)


@pytest.mark.parametrize("argv,message", [
    (["--model", "tiny"], "--model: applies to --executor real only, and this run uses --executor sim"),
    (["--device", "cuda", "--threads", "2"], "--device, --threads: apply to --executor real only"),
    (["--speed-probe"], "--speed-probe: applies to --executor real only"),
    (["--url", "http://127.0.0.1:9"], "--url: applies to --executor server only"),
    (["--executor", "real", "--cost-model", str(CPU_PROFILE)], "--cost-model: applies to --executor sim only, and "
                                                               "this run uses --executor real"),
    (["--executor", "server", "--model", "tiny"], "--model: applies to --executor real only, and this run uses "
                                                  "--executor server"),
    (["--replay", str(CPU_RUNS / "cpu-chat")], "give a workload ('chat') or --replay REAL_RUN_DIR, not both"),
    (["--jobs", "0"], "argument --jobs: must be an integer >= 1, got 0"),
    (["--jobs", "-1"], "argument --jobs: must be an integer >= 1, got -1"),
])
def test_sim_run_refuses_flags_that_would_do_nothing_or_are_out_of_range(capsys, argv, message):
    assert exit_code(run_main, [*SMALL_CHAT, *argv]) == 2
    assert message in one_line_error(capsys)


def test_a_replay_takes_no_workload_flags(capsys):
    assert exit_code(run_main, ["--replay", str(CPU_RUNS / "cpu-chat"), "--set", "engine.max_num_seqs=2"]) == 2
    assert "--set: not used by --replay" in one_line_error(capsys)


def test_paths_of_the_wrong_kind_are_named(tmp_path, capsys):
    a_file = tmp_path / "notes.md"
    a_file.write_text("not a run\n")
    assert exit_code(run_main, [*SMALL_CHAT, "--out", str(a_file)]) == 2
    assert f"--out: '{a_file}' is a file, not a directory" in one_line_error(capsys)
    assert exit_code(run_main, ["--replay", str(a_file)]) == 2
    assert f"'{a_file}' is not a directory" in one_line_error(capsys)
    assert exit_code(retime_main, [str(a_file)]) == 2
    assert f"'{a_file}' is not a directory" in one_line_error(capsys)
    assert exit_code(retime_main, [str(CPU_RUNS / "cpu-chat"), "--out", str(a_file)]) == 2
    assert f"--out: '{a_file}' is a file, not a directory" in one_line_error(capsys)
    assert exit_code(retime_main, [str(CPU_RUNS / "cpu-chat"), "--threads", "0"]) == 2
    assert "argument --threads: must be an integer >= 1, got 0" in one_line_error(capsys)
    assert exit_code(calibrate_main, [str(a_file), "-o", str(tmp_path / "p.json")]) == 2
    assert f"'{a_file}' is not a directory" in one_line_error(capsys)
    assert exit_code(calibrate_main, [str(CPU_RUNS / "cpu-calibrate"), "-o", str(tmp_path)]) == 2
    assert f"-o/--output: '{tmp_path}' is a directory" in one_line_error(capsys)


@pytest.mark.parametrize("held_out", ["0", "1", "-0.2", "1.5"])
def test_calibrate_takes_a_held_out_fraction_strictly_between_0_and_1(tmp_path, capsys, held_out):
    assert exit_code(calibrate_main, [str(CPU_RUNS / "cpu-calibrate"), "-o", str(tmp_path / "p.json"),
                                      "--held-out", held_out]) == 2
    assert f"argument --held-out: must be in (0, 1), both ends excluded, got {held_out}" in one_line_error(capsys)
    assert not (tmp_path / "p.json").exists()


def test_calibrate_refuses_a_held_out_fraction_that_starves_a_side(tmp_path, capsys):
    assert exit_code(calibrate_main, [str(CPU_RUNS / "cpu-calibrate"), "-o", str(tmp_path / "p.json"),
                                      "--held-out", "0.999"]) == 2
    assert "--held-out 0.999 leaves 2 of the 2070 steps to fit" in one_line_error(capsys)


def test_an_unreachable_server_is_named(tmp_path, capsys):
    assert exit_code(run_main, [*SMALL_CHAT, "--executor", "server", "--url", "http://127.0.0.1:1",
                                "--out", str(tmp_path / "run")]) == 2
    assert "error: cannot reach the server at http://127.0.0.1:1:" in one_line_error(capsys)


def test_the_simulator_refuses_a_max_model_len_beyond_the_model(tmp_path, capsys):
    assert exit_code(run_main, [*SMALL_CHAT, "--set", "engine.max_model_len=1000000", "--set",
                                "workload.prompt_len={type: constant, value: 100000}",
                                "--out", str(tmp_path / "run")]) == 2
    assert ("error: engine.max_model_len: 1000000 exceeds what model 'llama-3-8b' supports (8192, its "
            "max_position_embeddings)") in one_line_error(capsys)
    assert not (tmp_path / "run").exists()


def test_a_profile_fitted_elsewhere_is_a_clean_warning_line(tmp_path, capsys):
    assert run_main([*SMALL_CHAT, "--cost-model", str(CPU_PROFILE), "--out", str(tmp_path / "run")]) == 0
    err = capsys.readouterr().err
    assert "warning: cost_model: the profile was fitted for hardware 'AMD EPYC (1 thread)', but this run uses " \
           "'h100-sxm'" in err
    assert "UserWarning" not in err and "warnings.warn" not in err
