"""What ``sim.validate`` prints beside the fidelity table: the machine's speed, the sensitivity of each
headline metric to the step times, and the step-time error by kind of step."""

from __future__ import annotations

from rich.table import Table

# The metrics the acceptance criteria name: p50 and p90 of TTFT, TPOT and E2E, and throughput.
HEADLINE_METRICS = ("request_throughput", "output_token_throughput", "ttft_ms.p50", "ttft_ms.p90", "tpot_ms.p50",
                    "tpot_ms.p90", "e2e_ms.p50", "e2e_ms.p90")


def headline_error(comparison: dict) -> float:
    """The largest |relative error| among the headline metrics (p50/p90 TTFT, TPOT, E2E; throughput) that
    have one; ``undefined_headline_metrics`` names those without (they are not counted as 0% silently)."""
    return max((abs(error) for key in HEADLINE_METRICS
                if (error := comparison["metrics"][key]["relative_error"]) is not None), default=0.0)


def undefined_headline_metrics(comparison: dict) -> list[str]:
    """Headline metrics with no relative error: missing in a run (no request had 2 tokens for TPOT, none
    finished), or a real value of 0 against a simulated one that is not."""
    return [key for key in HEADLINE_METRICS if comparison["metrics"][key]["relative_error"] is None]


def describe_headline_error(comparison: dict) -> str:
    """The report's headline line: the largest error, and the metrics it could not be computed for."""
    line = f"largest headline error (p50/p90 TTFT, TPOT, E2E; throughput): {headline_error(comparison):.1%}"
    undefined = undefined_headline_metrics(comparison)
    if undefined:
        line += f" (no error for {', '.join(undefined)}: missing in a run, or 0 in the real one)"
    return line


def describe_sensitivity(gains: dict[str, float | None], profile_speed_error: float | None = None) -> str:
    """``profile_speed_error``: how well the profile's calibration recordings pin its speed down
    (``sim.calibrate.speed_standard_error``), which the largest gain turns into latency uncertainty."""
    latency = {key: gain for key, gain in gains.items() if gain is not None and "throughput" not in key}
    worst = max(latency, key=lambda key: abs(latency[key]))
    described = ("sensitivity: 1% more time in every step moves " + ", ".join(f"{key} {gain:+.1f}%" for key, gain
                 in latency.items()) + f"; a step-time error of e moves {worst} by about {abs(latency[worst]):.0f}e")
    if profile_speed_error is not None:
        described += (f". The profile's speed is known within {profile_speed_error:.1%} (one standard error over "
                      f"its calibration recordings): {abs(latency[worst]) * profile_speed_error:.1%} on {worst} "
                      "from its speed alone, before any error of the model's")
    return described


def describe_machine_speed(comparison: dict) -> str | None:
    """One line on the speed probe: how fast the machine ran, and what simulating at that speed changed."""
    speed = comparison.get("machine_speed")
    if speed is None:
        return None
    phases = ", ".join(f"{phase} {factor - 1:+.1%}" for phase, factor in speed["by_phase"].items())
    line = (f"speed probe: steps took {speed['speed_factor'] - 1:+.1%} against the profile's speed ({phases}); "
            f"at that speed the profile would time the run's own steps {speed['residual_step_time_error']:+.1%} in total")
    if speed["applied"]:
        return (line + "; the simulation ran at that speed. At the profile's speed the largest headline error is "
                f"{headline_error(comparison['at_profile_speed']):.1%}")
    return line + " (--at-probed-speed simulates at that speed)"


def step_kind_table(rows: list[dict]) -> Table:
    """The step-time error by kind of step: where the model mispredicts, weighted by the time it costs."""
    table = Table(title="the profile on the real run's own steps, by kind (prefill: tokens per step): share of "
                        "step time, error of their total, median |error| per step")
    for column in ("kind of step", "steps", "share", "total", "median"):
        table.add_column(column, justify="left" if column == "kind of step" else "right", no_wrap=True)
    for row in rows:
        table.add_row(row["kind"], str(row["num_steps"]), f"{row['time_share']:.0%}", f"{row['total']:+.1%}",
                      f"{row['median_abs']:.1%}")
    return table
