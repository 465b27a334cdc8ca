"""One simulation against several real recordings of the same workload: their mean, and their spread.

On a shared machine the same workload, code and configuration, recorded twice minutes apart, can
differ by tens of percent in a latency percentile: the machine's speed drifts, and a loaded queue
multiplies a few percent of service time. A simulation compared with one recording then inherits that
recording's luck. Compared with each metric's mean over several recordings, and next to how far the
recordings lie from that mean, its error reads for what it is: inside or outside the machine's own noise.
The mean is itself uncertain: its standard error (relative to it) says how far beyond that uncertainty
an error against the mean lies.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from analysis.fidelity import FIDELITY_METRICS, relative_error
from analysis.report import summary_value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def mean_metrics(real_summaries: Sequence[Mapping[str, Any]], metrics: Sequence[str] = FIDELITY_METRICS
                 ) -> dict[str, float | None]:
    """Each metric's mean over the recordings (None where any recording lacks it)."""
    means: dict[str, float | None] = {}
    for key in metrics:
        values = [summary_value(summary, key) for summary in real_summaries]
        means[key] = sum(values) / len(values) if values and all(map(_is_number, values)) else None
    return means


def compare_with_mean(sim_summary: Mapping[str, Any], real_summaries: Sequence[Mapping[str, Any]],
                      metrics: Sequence[str] = FIDELITY_METRICS) -> dict[str, dict[str, Any]]:
    """Per metric: the simulated value, the recordings' mean, and the relative error between them."""
    means = mean_metrics(real_summaries, metrics)
    return {key: {"sim": summary_value(sim_summary, key), "real": means[key],
                  "relative_error": relative_error(summary_value(sim_summary, key), means[key])} for key in metrics}


def spread_about_mean(real_summaries: Sequence[Mapping[str, Any]], metrics: Sequence[str] = FIDELITY_METRICS
                      ) -> dict[str, float | None]:
    """Per metric: the largest |recording / mean - 1| among the recordings, the real runs' own noise."""
    means = mean_metrics(real_summaries, metrics)
    spread: dict[str, float | None] = {}
    for key in metrics:
        errors = [relative_error(summary_value(summary, key), means[key]) for summary in real_summaries]
        spread[key] = max(abs(error) for error in errors) if all(error is not None for error in errors) else None
    return spread


def standard_error_of_mean(real_summaries: Sequence[Mapping[str, Any]], metrics: Sequence[str] = FIDELITY_METRICS
                           ) -> dict[str, float | None]:
    """Per metric: the standard error of the recordings' mean, relative to the mean (sample standard
    deviation / sqrt(n) / mean); None with fewer than two recordings or where one lacks the metric."""
    errors: dict[str, float | None] = {}
    for key in metrics:
        values = [summary_value(summary, key) for summary in real_summaries]
        if len(values) < 2 or not all(map(_is_number, values)) or not statistics.fmean(values):
            errors[key] = None
            continue
        errors[key] = statistics.stdev(values) / len(values) ** 0.5 / abs(statistics.fmean(values))
    return errors
