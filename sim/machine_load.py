"""How busy the rest of the machine was while a real run measured its steps.

Real step times on a CPU depend on what else runs: on a two-core machine, a test suite on the other
core slowed a recorded calibration run's decode steps by 6% (re-timed on the quiet machine with
``python -m sim.retime``), through the shared last-level cache and memory bandwidth, without taking a
single cycle from the run's own thread. A profile fitted on such a run predicts every quiet run too
slow. The run therefore records how many CPUs other processes kept busy on average, from the kernel's
counters (``/proc/stat``) less this process's own CPU time, and ``sim.calibrate`` warns about runs
recorded beside other work.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

# Other processes' average CPU use above which a run's timings are suspect (in CPUs).
BUSY_MACHINE_CPUS = 0.25


def _busy_seconds() -> float | None:
    """CPU seconds all processes spent busy since boot (user, nice, system, irq, softirq, steal), or None
    where /proc/stat does not exist."""
    try:
        with open("/proc/stat") as handle:
            fields = handle.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    user, nice, system, _idle, _iowait, irq, softirq, *rest = (int(value) for value in fields[1:])
    steal = rest[0] if rest else 0
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    times = os.times()
    return times.user + times.system


@dataclass
class MachineLoad:
    """Started before a run, read after it."""
    started_wall: float
    started_busy: float | None
    started_own: float

    @classmethod
    def start(cls) -> MachineLoad:
        return cls(time.monotonic(), _busy_seconds(), _own_seconds())

    def summary(self) -> dict:
        wall = time.monotonic() - self.started_wall
        busy = _busy_seconds()
        result = {"cpus": os.cpu_count(), "wall_s": wall, "load_average_1m": os.getloadavg()[0]}
        if self.started_busy is not None and busy is not None and wall > 0:
            others = (busy - self.started_busy) - (_own_seconds() - self.started_own)
            result["other_processes_cpus"] = max(others, 0.0) / wall
        return result


def busy_machine_warning(machine: dict | None, run: str) -> str | None:
    """A warning when other processes kept the machine busy during the run ``machine`` describes."""
    if not machine or machine.get("other_processes_cpus") is None:
        return None
    others = machine["other_processes_cpus"]
    if others <= BUSY_MACHINE_CPUS:
        return None
    return (f"{run}: other processes kept {others:.2f} CPUs busy on average while it ran; its step times "
            f"are likely slower than on a quiet machine (re-time it there with python -m sim.retime)")
