"""A real run records how busy the rest of the machine was; calibration warns about busy runs."""

from __future__ import annotations

import sys

import pytest

from sim.machine_load import BUSY_MACHINE_CPUS, MachineLoad, busy_machine_warning


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
