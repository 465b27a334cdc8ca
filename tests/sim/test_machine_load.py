"""A real run records how busy the rest of the machine was; calibration warns about busy runs."""

from __future__ import annotations

import sys
import time

import pytest

from sim.machine_load import BUSY_MACHINE_CPUS, TIME_SHARED_ON_CPU_FRACTION, MachineLoad, busy_machine_warning


def test_a_run_records_the_machine_load():
    load = MachineLoad.start()
    sum(range(200_000))  # some work of this process's own, which must not count as other processes'
    summary = load.summary()
    assert summary["cpus"] >= 1 and summary["wall_s"] > 0 and summary["load_average_1m"] >= 0
    if sys.platform.startswith("linux"):
        assert summary["other_processes_cpus"] >= 0


@pytest.mark.parametrize("others, warns", [(0.0, False), (BUSY_MACHINE_CPUS, False), (0.9, True)])
def test_busy_machine_warning(others, warns):
    warning = busy_machine_warning({"other_processes_cpus": others}, "runs/cal")
    assert (warning is not None) is warns
    if warns:
        assert "runs/cal" in warning and "0.90 CPUs" in warning and "sim.retime" in warning


def test_runs_recorded_before_the_load_was_measured_raise_no_warning():
    assert busy_machine_warning(None, "old") is None
    assert busy_machine_warning({"cpus": 2}, "old") is None


def test_a_cpu_run_records_the_share_of_its_steps_spent_on_a_cpu():
    load = MachineLoad.start()
    time.sleep(0.2)  # a "step" spent off the CPU: runnable or not, its thread did not compute
    summary = load.summary(steps_wall_s=0.2)
    assert 0 <= summary["own_cpu_s"] < 0.05
    assert summary["steps_on_cpu_fraction"] == pytest.approx(summary["own_cpu_s"] / 0.2)
    assert summary["steps_on_cpu_fraction"] < TIME_SHARED_ON_CPU_FRACTION
    # A GPU run's thread waits for the device inside its steps: it gives no steps' wall time.
    assert "steps_on_cpu_fraction" not in MachineLoad.start().summary()


@pytest.mark.parametrize("on_cpu, warns", [(1.0, False), (TIME_SHARED_ON_CPU_FRACTION, False), (0.6, True)])
def test_a_time_shared_run_is_warned_about(on_cpu, warns):
    warning = busy_machine_warning({"other_processes_cpus": 0.0, "steps_on_cpu_fraction": on_cpu}, "runs/cal")
    assert (warning is not None) is warns
    if warns:
        assert warning.startswith("runs/cal: ") and "60%" in warning and "faster than it ran" in warning


def test_both_warnings_come_together():
    warning = busy_machine_warning({"other_processes_cpus": 1.4, "steps_on_cpu_fraction": 0.55}, "runs/cal")
    assert "1.40 CPUs" in warning and "55%" in warning and len(warning.splitlines()) == 2
