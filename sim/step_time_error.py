"""How well a profile times a real run's own steps: the step-level error under the latency errors.

A simulated run diverges from the real one in two ways: the cost model times a step wrong, and then
the queues carry that error on (a service time 5% too long makes waiting time in a loaded queue far more
than 5% too long). ``sim.validate`` compares latencies; this module isolates the first part by timing
every step the real run recorded, with the features it recorded, and comparing with the measured
durations. When the total is off by a few percent on every recording of a workload, the machine ran
at another speed than during calibration (or the model lacks a feature: see by kind of step); when
the step times are right but latencies are not, the difference is in the queueing. A LoRA run's steps are
compared on what their durations leave after the recorded adapter loads (step_feature_frame), as the
profile's step terms were fitted: the loads are priced apart.

``step_time_error_by_kind`` splits the error by what the step did (decodes only; a prefill chunk of a
given size, fresh, after a context already in the cache, or after a long one): the kinds that carry
most of the time and are off in the same direction on every recording are where the model needs a term.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sim.calibration_fit import SAMPLED_COUNTS_COLUMN, step_feature_frame
from sim.cost_models import CalibratedCostModel, StepFeatures

_FEATURE_FIELDS = StepFeatures.__slots__


def predicted_step_times(model: CalibratedCostModel, steps: pd.DataFrame) -> tuple[np.ndarray, pd.DataFrame]:
    """(predicted seconds, feature table) of each recorded step that scheduled tokens. A speculating run's steps
    (it recorded ``sampled_token_counts``) timed by a profile fitted on n-gram runs include its lookups."""
    lookup_s = model.ngram_lookup_s
    lookups = lookup_s is not None and SAMPLED_COUNTS_COLUMN in steps.columns
    features = step_feature_frame(steps, ngram_lookups=lookups)
    records = features[list(_FEATURE_FIELDS)].astype(int).to_dict("records")
    predicted = np.array([model.step_time_from_features(StepFeatures(**record)) for record in records])
    if lookups:
        predicted += lookup_s * features["ngram_lookups"].to_numpy(float)
    return predicted, features


def step_time_error(model: CalibratedCostModel, steps: pd.DataFrame) -> dict[str, float | int]:
    """Relative error of the predicted total step time (all steps, decode-only, with a prefill chunk),
    the median absolute per-step error, (predicted - measured) / measured, and the rows of
    ``step_time_error_by_kind`` under ``by_kind`` (one prediction per step serves both)."""
    predicted, features = predicted_step_times(model, steps)
    measured = features["duration"].to_numpy(float)
    if not len(measured):
        return {"num_steps": 0}
    with_prefill = features["num_prefill_reqs"].to_numpy() > 0
    report: dict[str, float | int] = {
        "num_steps": int(len(measured)),
        "total": float(predicted.sum() / measured.sum() - 1),
        "median_abs": float(np.median(np.abs(predicted - measured) / measured)),
    }
    for name, selected in (("decode_only_total", ~with_prefill), ("with_prefill_total", with_prefill)):
        if selected.any():
            report[name] = float(predicted[selected].sum() / measured[selected].sum() - 1)
    report["by_kind"] = _error_by_kind(predicted, features)
    report["sharing_error"] = time_sharing_error(report["by_kind"])
    return report


def time_sharing_error(by_kind: list[dict]) -> float:
    """How wrongly the profile shares a run's time between kinds of step, whatever its overall speed:
    with the prediction scaled to the measured total, the time-weighted mean of each kind's |error|.

    The machine's speed drifts by a few percent between recordings and moves every step alike, so the
    total error of one recording is mostly that drift; this figure is unchanged by it (scaling every
    step by one factor leaves it as it was). It is what a model change should improve: latency
    percentiles move 2-10% by chance between recordings, a recording's sharing error by a fraction of
    a point. Zero when every kind is off by the same factor."""
    if not by_kind:
        return 0.0
    scale = 1 / (1 + sum(row["time_share"] * row["total"] for row in by_kind))  # measured total / predicted
    return float(sum(row["time_share"] * abs((1 + row["total"]) * scale - 1) for row in by_kind))


# Prefill tokens in a step: the edges of the size classes (on the CPU a step's cost per token changes
# between a few rows, a few hundred and a full 1024-token budget).
PREFILL_TOKEN_EDGES = (128, 512)
# Cached context the step's chunks read, above which a step is "after a long context": on the CPU the
# shipped profile timed single chunks that end 2,000-3,000 keys in 10-15% fast and those within 1,024
# keys 2-4% slow, and a single "after context" class mixed the two.
LONG_CONTEXT_TOKENS = 1024


def step_kind_labels(features: pd.DataFrame) -> np.ndarray:
    """Each step's kind: "decode only", or "prefill <tokens in the step's chunks>, <fresh | after context |
    after >1,024 cached>" (the cached context summed over the step's chunks); ", encodes images" after either for a
    step that runs the vision encoder."""
    prefill_tokens = features["num_prefill_tokens"].to_numpy()
    low, high = PREFILL_TOKEN_EDGES
    size = np.where(prefill_tokens <= low, f"1-{low}", np.where(prefill_tokens <= high, f"{low + 1}-{high}",
                                                                 f">{high}"))
    context_tokens = features["prefill_context_tokens"].to_numpy()
    context = np.where(context_tokens > LONG_CONTEXT_TOKENS, f"after >{LONG_CONTEXT_TOKENS:,} cached",
                       np.where(context_tokens > 0, "after context", "fresh"))
    labels = np.char.add(np.char.add(np.char.add("prefill ", size), ", "), context)
    labels = np.where(features["num_prefill_reqs"].to_numpy() > 0, labels, "decode only")
    if "num_encoder_tokens" in features.columns:
        # A step that runs the vision encoder first is its own kind, whatever its chunks: the encoder's terms
        # are what such a step adds.
        encodes = features["num_encoder_tokens"].to_numpy() > 0
        labels = np.where(encodes, np.char.add(labels.astype(str), ", encodes images"), labels)
    return labels


def step_time_error_by_kind(model: CalibratedCostModel, steps: pd.DataFrame) -> list[dict]:
    """Per kind of step (``step_kind_labels``), largest share of the measured time first: how many steps,
    their share of the run's step time, the error of their total and the median |error| per step."""
    return _error_by_kind(*predicted_step_times(model, steps))


def _error_by_kind(predicted: np.ndarray, features: pd.DataFrame) -> list[dict]:
    if not len(predicted):
        return []
    table = pd.DataFrame({"kind": step_kind_labels(features), "predicted": predicted,
                          "measured": features["duration"].to_numpy(float)})
    table["abs_error"] = (table["predicted"] - table["measured"]).abs() / table["measured"]
    grouped = table.groupby("kind").agg(num_steps=("measured", "size"), measured=("measured", "sum"),
                                        predicted=("predicted", "sum"), median_abs=("abs_error", "median"))
    grouped = grouped.sort_values("measured", ascending=False)
    total = table["measured"].sum()
    return [{"kind": kind, "num_steps": int(row.num_steps), "time_share": float(row.measured / total),
             "total": float(row.predicted / row.measured - 1), "median_abs": float(row.median_abs)}
            for kind, row in grouped.iterrows()]


def describe_step_time_error(report: dict) -> str | None:
    if not report.get("num_steps"):
        return None
    parts = [f"{report[key]:+.1%} {label}" for key, label in (("decode_only_total", "decode-only"),
                                                               ("with_prefill_total", "with a prefill chunk"))
             if key in report]
    sharing = (f"; time shared between kinds of step {report['sharing_error']:.1%} off at the measured total"
               if "sharing_error" in report else "")
    return (f"the profile times the real run's own {report['num_steps']} steps {report['total']:+.1%} in total "
            f"({', '.join(parts)}; median |error| per step {report['median_abs']:.1%}{sharing})")
