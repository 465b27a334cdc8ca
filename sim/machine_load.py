"""How busy the rest of the machine was while a real run measured its steps.

Real step times on a CPU depend on what else runs: on a two-core machine, a test suite on the other
core slowed a recorded calibration run's decode steps by 6% (re-timed on the quiet machine with
``python -m sim.retime``), through the shared last-level cache and memory bandwidth, without taking a
single cycle from the run's own thread. A profile fitted on such a run predicts every quiet run too
slow. The run therefore records how many CPUs other processes kept busy on average, from the kernel's
counters (``/proc/stat``) less this process's own CPU time, and ``sim.calibrate`` and ``sim.validate``
warn about runs recorded beside other work.

Worse than sharing caches is sharing the CPUs themselves: with more runnable threads than CPUs, the
run's thread is taken off its CPU for whole scheduler slices (milliseconds, as long as a small model's
step), so some steps last several times as long as the same step run through. A CPU run therefore also
records the share of its steps' wall time its own thread spent on a CPU. The calibration fit weighs each
step by its relative error, so it times the steps that ran through: on a two-core machine beside two or
three other busy processes, small runs were on a CPU for 48-63% of their steps' time, and a profile
fitted on one of them put its throughput 37-81% higher than the run's, while the same profile at the
run's own measured speed came within 1%.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

# Other processes' average CPU use above which a run's timings are suspect (in CPUs).
BUSY_MACHINE_CPUS = 0.25
# The share of its steps' wall time a CPU run's thread spent on a CPU below which the run was time-shared.
# A run with a CPU to itself measures 0.99-1.01 (its bookkeeping between steps counts in both).
TIME_SHARED_ON_CPU_FRACTION = 0.9


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

    def summary(self, steps_wall_s: float | None = None) -> dict:
        """``steps_wall_s``: the wall time of the run's steps, given by CPU runs only (a GPU run's thread
        waits for the device inside its steps), for ``steps_on_cpu_fraction``."""
        wall = time.monotonic() - self.started_wall
        busy = _busy_seconds()
        own = _own_seconds() - self.started_own
        result = {"cpus": os.cpu_count(), "wall_s": wall, "load_average_1m": os.getloadavg()[0], "own_cpu_s": own}
        if self.started_busy is not None and busy is not None and wall > 0:
            others = (busy - self.started_busy) - own
            result["other_processes_cpus"] = max(others, 0.0) / wall
        if steps_wall_s:
            # The process's CPU time against its steps' wall time: between steps it only sleeps (waiting
            # for an arrival), so what the steps lack was spent runnable but off a CPU.
            result["steps_on_cpu_fraction"] = own / steps_wall_s
        return result


def busy_machine_warning(machine: dict | None, run: str) -> str | None:
    """A warning when other processes kept the machine busy during the run ``machine`` describes, or
    took its CPU from it."""
    if not machine:
        return None
    warnings = []
    others = machine.get("other_processes_cpus")
    if others is not None and others > BUSY_MACHINE_CPUS:
        warnings.append(f"{run}: other processes kept {others:.2f} CPUs busy on average while it ran; its step "
                        f"times are likely slower than on a quiet machine (re-time it there with python -m sim.retime)")
    on_cpu = machine.get("steps_on_cpu_fraction")
    if on_cpu is not None and on_cpu < TIME_SHARED_ON_CPU_FRACTION:
        warnings.append(f"{run}: its thread was on a CPU for only {on_cpu:.0%} of its steps' wall time (more busy "
                        f"threads than CPUs); a profile fitted on it times the steps that ran through, so it "
                        f"simulates such a run faster than it ran")
    return "\n".join(warnings) or None
