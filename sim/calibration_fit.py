"""Fitting a step-time model to measured steps: non-negative least squares, judged on held-out steps.

A step's duration is modelled as a sum of non-negative costs, one per feature the cost model reads
(tokens through the linear layers, requests sampled, KV tokens read by decodes, query-key pairs of
prefill attention, ...) plus a fixed per-step cost. Non-negativity keeps every term physical (no
feature makes a step faster) and the model readable: each coefficient is "seconds per unit". The one
exception is a discount: KV tokens read again from shared blocks, already charged as KV read, may cost
less the second time.

The fit minimises *relative* error (each row is divided by its duration), because step durations
span orders of magnitude between a one-request decode and a long prefill and every one of them matters
to latency. Candidates are compared on steps held out of the fit, and the best one is kept: a plain
linear model; the same with hinge terms on the token count (a regime with a different slope) and on the
KV tokens decodes read (on a CPU, reading KV costs more per token once a step's KV outgrows the
last-level cache); and each with a small-batch table, one offset per token count up to a few tokens,
the only terms allowed to be negative (on a CPU, the matrix kernels for 1, 2 and 3 rows differ in kind
and a 3-row step can take longer than a 4-row one, which no smooth term captures).

Steps of LoRA runs are fitted on their duration less their recorded adapter loads (priced apart, by
sim/lora_load_fit.py), with the adapters' terms of LORA_FEATURE_SETS added to every candidate; the set kept is
the one that times the held-out steps with adapter tokens best. Without adapter tokens nothing changes.
Steps of runs that speculate with n-gram lookups get the verification terms of SPEC_FEATURE_SETS and the lookups'
own term (``ngram_lookups``: requests that sampled, each looked up once after the pass), chosen the same way on the
held-out steps of those runs.
"""

from __future__ import annotations

import itertools

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.optimize import lsq_linear

# Step-trace column -> the cost-model feature of the same meaning (sim/cost_models/step_batch.py).
FEATURE_COLUMNS = {
    "num_scheduled_tokens": "num_tokens",
    "num_reqs": "num_reqs",
    "num_prefill_reqs": "num_prefill_reqs",
    "num_prefill_tokens": "num_prefill_tokens",
    "num_decode_reqs": "num_decode_reqs",
    "decode_context_tokens": "decode_context_tokens",
    "prefill_context_tokens": "prefill_context_tokens",
    "prefill_attention_work": "prefill_attention_work",
    "max_seq_len": "max_seq_len",
    "prefill_attention_dense_work": "prefill_attention_dense_work",
    "context_prefill_dense_work": "context_prefill_dense_work",
    "prefill_attention_sliced_work": "prefill_attention_sliced_work",
    "shared_context_tokens": "shared_context_tokens",
    "kv_block_runs": "kv_block_runs",
    # Speculative decoding's verifications (recorded only by runs that speculate; no profile prices them yet).
    "num_spec_tokens": "num_spec_tokens",
    "spec_attention_work": "spec_attention_work",
    "num_spec_reqs": "num_spec_reqs",
    "spec_context_tokens": "spec_context_tokens",
    # Multi-LoRA serving's adapter tokens and distinct adapters (recorded only by LoRA runs: LORA_FEATURE_SETS).
    "num_lora_tokens": "num_lora_tokens",
    "num_active_loras": "num_active_loras",
    # Multimodal items' encoder work (recorded only by runs with images; no profile prices it: a vision encoder
    # needs the analytical cost model).
    "num_encoder_tokens": "num_encoder_tokens",
    "encoder_attention_work": "encoder_attention_work",
}
# A LoRA run's slot fills: how many, how many read from disk first, and their measured seconds (part of the
# step's duration). The fit prices the adapters' compute on what a step's duration leaves after its loads
# (``duration`` in step_feature_frame); the loads are fitted apart (sim/lora_load_fit.py).
LORA_LOAD_COLUMNS = ("num_lora_loads", "num_lora_disk_loads", "lora_load_s")
LINEAR_FEATURES = ("num_tokens", "num_reqs", "num_prefill_reqs", "has_prefill", "decode_graph_batch",
                   "decode_context_tokens", "prefill_context_tokens", "prefill_attention_work",
                   "prefill_attention_dense_work", "context_prefill_dense_work", "prefill_attention_sliced_work",
                   "shared_context_tokens", "kv_block_runs")
HINGE_FEATURE = "num_tokens"
CONTEXT_HINGE_FEATURE = "decode_context_tokens"
# Features whose cost may be negative: shared KV tokens are also in decode_context_tokens, and a block
# read again in the same step comes from cache, so its term is the discount on the second read.
DISCOUNT_FEATURES = ("shared_context_tokens",)
OPTIONAL_COLUMNS = ("prefill_attention_dense_work", "context_prefill_dense_work", "prefill_attention_sliced_work",
                    "shared_context_tokens", "kv_block_runs", "num_spec_tokens", "spec_attention_work", "num_spec_reqs",
                    "spec_context_tokens",
                    "num_lora_tokens", "num_active_loras", "num_encoder_tokens", "encoder_attention_work",
                    *LORA_LOAD_COLUMNS)
# A speculating run's tokens returned per scheduled request (recorded for its replay): the requests that sampled.
SAMPLED_COUNTS_COLUMN = "sampled_token_counts"
# The adapters' compute terms tried when the recordings have adapter tokens, simplest first; each later set
# must beat the kept one clearly (2%) on the held-out steps with adapter tokens. Per adapter token: the
# shrink and expand FLOPs (and on a CPU the gather of the adapter's rows); per distinct adapter: its weights
# read once and its own matmul calls (this runner loops over the batch's adapters, sim/cost_models/
# lora_cost.py). Recordings without adapter tokens fit none of them, exactly as before LoRA existed.
LORA_FEATURE_SETS = (("num_lora_tokens",), ("num_active_loras",), ("num_lora_tokens", "num_active_loras"))
# The vision encoder's terms tried when the recordings encode images, simplest first, judged the same way on the
# held-out steps that encode one: per encoder token (patch embedding, MLPs, projector: linear in the patches), and
# per image's tokens squared (its attention scores every patch against every other of the same image). Images of
# one fixed size (LLaVA) make the two proportional, and the simpler set stays.
ENCODER_FEATURE_SETS = (("num_encoder_tokens",), ("num_encoder_tokens", "encoder_attention_work"))
# Speculative decoding's terms tried when the recordings speculate with n-gram lookups, simplest first, judged on
# the held-out steps of those runs. A draft row already pays num_tokens' cost through the linear layers; it adds
# its logits and sampling (num_spec_tokens: the lm_head over the vocabulary is a large share of a row on a small
# model), and may add attention (spec_attention_work: its query against the request's context). A backend that
# attends a verification apart from the batched decodes (the torch backend on a CPU) may pay per verification and
# per KV token it reads there (num_spec_reqs, spec_context_tokens). Every request that sampled was looked up once
# after the pass (ngram_lookups: the proposer's CPU time, part of the step).
SPEC_FEATURE_SETS = (("num_spec_tokens", "ngram_lookups"), ("num_spec_tokens", "spec_attention_work", "ngram_lookups"),
                     ("num_spec_tokens", "num_spec_reqs", "spec_context_tokens", "ngram_lookups"),
                     ("num_spec_tokens", "spec_attention_work", "num_spec_reqs", "spec_context_tokens",
                      "ngram_lookups"))


# What the steps of each family of terms hold, for a person (the column that marks them -> words).
FAMILY_WORK = {"num_lora_tokens": "adapter tokens", "num_encoder_tokens": "encoder tokens",
               "ngram_lookups": "n-gram lookups (steps of speculating runs)"}


# Token counts that may get their own offset: those with at least this many steps in the training set.
MIN_STEPS_PER_OFFSET = 5
# The fewest steps either side of the held-out split: what the default 20% leaves of the fewest steps
# calibration takes (20), so a held-out fraction that starves either side is refused, not fitted.
MIN_FIT_STEPS = 16
MIN_HELD_OUT_STEPS = 4


@dataclass
class FitResult:
    kind: str
    coefficients: dict[str, float]
    intercept_s: float
    hinges: list[dict] = field(default_factory=list)
    token_count_offsets_s: dict[int, float] = field(default_factory=dict)
    held_out_errors: np.ndarray = field(default_factory=lambda: np.zeros(0))
    train_errors: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # Which held-out steps had a prefill chunk, and their measured durations: the error by kind of step,
    # and of the held-out steps' total time (what latency sums over), next to the per-step median.
    held_out_has_prefill: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    held_out_durations: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # LoRA recordings only: each tried set of adapter terms (names joined by "+") -> the median |error| of the
    # held-out steps with adapter tokens, and how many such steps there were.
    lora_feature_errors: dict[str, float] = field(default_factory=dict)
    num_held_out_lora_steps: int = 0
    # Recordings with images, the same for the encoder's terms and the held-out steps that encode an image. (With
    # adapters and images both, each set is tried beside each, and both tables hold the pairs, on the steps with
    # either.)
    encoder_feature_errors: dict[str, float] = field(default_factory=dict)
    num_held_out_encoder_steps: int = 0
    # N-gram speculating recordings, the same for the verification and lookup terms and the held-out steps of those
    # recordings.
    spec_feature_errors: dict[str, float] = field(default_factory=dict)
    num_held_out_spec_steps: int = 0

    def predict(self, features: pd.DataFrame) -> np.ndarray:
        seconds = np.full(len(features), self.intercept_s)
        for name, coefficient in self.coefficients.items():
            seconds += coefficient * features[name].to_numpy(float)
        for hinge in self.hinges:
            seconds += hinge["coefficient"] * np.maximum(0.0, features[hinge["feature"]].to_numpy(float) - hinge["knot"])
        if self.token_count_offsets_s:
            tokens = features["num_tokens"].to_numpy()
            seconds += np.array([self.token_count_offsets_s.get(int(count), 0.0) for count in tokens])
        return seconds

    def error_summary(self) -> dict[str, float]:
        errors = np.abs(self.held_out_errors)
        summary = {"median_ape": float(np.median(errors)), "p90_ape": float(np.percentile(errors, 90)),
                   "mean_ape": float(errors.mean()), "num_held_out_steps": int(errors.size),
                   "train_median_ape": float(np.median(np.abs(self.train_errors)))}
        if self.held_out_durations.size == errors.size and errors.size:
            mixed = self.held_out_has_prefill
            for name, selected in (("decode_only", ~mixed), ("with_prefill", mixed)):
                if selected.any():
                    summary[f"{name}_median_ape"] = float(np.median(errors[selected]))
                    summary[f"num_{name}_steps"] = int(selected.sum())
            durations = self.held_out_durations
            summary["total_time_ape"] = float(abs((self.held_out_errors * durations).sum()) / durations.sum())
        term_names = (*LORA_FEATURE_SETS[-1], *ENCODER_FEATURE_SETS[-1], *SPEC_FEATURE_SETS[-1])
        kept = "+".join(name for name in self.coefficients if name in term_names)
        if self.lora_feature_errors:
            summary["lora_steps_median_ape"] = self.lora_feature_errors[kept]
            summary["num_held_out_lora_steps"] = self.num_held_out_lora_steps
        if self.encoder_feature_errors:
            summary["encoder_steps_median_ape"] = self.encoder_feature_errors[kept]
            summary["num_held_out_encoder_steps"] = self.num_held_out_encoder_steps
        if self.spec_feature_errors:
            summary["spec_steps_median_ape"] = self.spec_feature_errors[kept]
            summary["num_held_out_spec_steps"] = self.num_held_out_spec_steps
        return summary


def step_feature_frame(steps: pd.DataFrame, ngram_lookups: bool = False) -> pd.DataFrame:
    """The cost-model features of each recorded step, named as the cost models name them. ``ngram_lookups``: the
    run speculated with n-gram lookups, one per request that sampled (the ``ngram_lookups`` column; 0 otherwise)."""
    if ngram_lookups and SAMPLED_COUNTS_COLUMN not in steps.columns:
        raise ValueError(f"steps.parquet lacks {SAMPLED_COUNTS_COLUMN!r}, which a speculating run records for its "
                         "replay: record it with this version")
    lookups = steps[SAMPLED_COUNTS_COLUMN].map(lambda counts: sum(1 for count in counts if count > 0)) \
        if ngram_lookups else 0
    steps = steps.assign(ngram_lookups=lookups)
    for column in OPTIONAL_COLUMNS:
        if column not in steps.columns:
            steps[column] = 0  # recorded before the column existed: the term simply drops out of the fit
    missing = [column for column in FEATURE_COLUMNS if column not in steps.columns]
    if missing:
        raise ValueError(f"steps.parquet lacks the feature columns {missing}: record it with this version")
    frame = steps[[*FEATURE_COLUMNS, "ngram_lookups"]].rename(columns=FEATURE_COLUMNS).astype(float)
    # Step-level features derived as StepFeatures derives them (has_prefill, decode_graph_batch).
    decode_only = frame["num_prefill_reqs"].to_numpy() == 0
    frame["has_prefill"] = (~decode_only).astype(float)
    padded = [1 << max(int(count) - 1, 0).bit_length() for count in frame["num_reqs"]]
    frame["decode_graph_batch"] = np.where(decode_only, padded, 0).astype(float)
    # What the step's compute took: a LoRA run's slot fills are measured apart and priced apart (0 elsewhere,
    # where the subtraction leaves every duration exactly as it was).
    frame["duration"] = steps["duration"].astype(float) - steps["lora_load_s"].astype(float)
    for column in LORA_LOAD_COLUMNS:
        frame[column] = steps[column].astype(float)
    return frame[frame["num_tokens"] > 0].reset_index(drop=True)


def _segments(values: np.ndarray, knots: list[float]) -> list[np.ndarray]:
    """``values`` split at the knots: one column per segment, so each segment gets its own slope."""
    edges = [0.0, *knots, np.inf]
    return [np.clip(values - low, 0.0, high - low) for low, high in zip(edges, edges[1:])]


def _design(features: pd.DataFrame, knots: dict[str, list[float]], offset_counts: list[int],
            fixed: dict[str, float] | None = None, extra: tuple[str, ...] = ()) -> np.ndarray:
    """Columns: 1, the linear features without knots, each feature with knots split into segments (each
    with its own non-negative slope: the cost per token may fall as matrix kernels grow more efficient,
    or rise as the KV read outgrows a cache, but a step never gets cheaper with more work), and the
    small-batch indicators. ``extra``: more plain features after the linear ones (the adapters' terms)."""
    columns = [np.ones(len(features))]
    columns += [features[name].to_numpy(float) for name in (*LINEAR_FEATURES, *extra)
                if name not in knots and name not in (fixed or {})]
    for name, feature_knots in knots.items():
        columns += _segments(features[name].to_numpy(float), feature_knots)
    tokens = features[HINGE_FEATURE].to_numpy(float)
    columns += [(tokens == count).astype(float) for count in offset_counts]
    return np.column_stack(columns)


def fit_candidate(train: pd.DataFrame, knots: list[float] | dict[str, list[float]],
                  offset_counts: list[int] = (), fixed: dict[str, float] | None = None,
                  extra: tuple[str, ...] = ()) -> FitResult:
    """``knots``: per feature (the token count, the decode KV read), where its slope may change; a plain
    list means knots on the token count only. ``fixed``: coefficients taken as given (seconds per unit,
    e.g. measured by a microbenchmark) for costs the runs hardly vary apart; the rest is fitted to what
    they leave of each step's duration. ``extra``: plain non-negative terms beyond LINEAR_FEATURES (the
    adapters' compute, LORA_FEATURE_SETS), listed after them in the result."""
    if not isinstance(knots, dict):
        knots = {HINGE_FEATURE: list(knots)}
    knots = {name: list(values) for name, values in knots.items() if values}
    fixed = dict(fixed or {})
    offset_counts = list(offset_counts)
    design = _design(train, knots, offset_counts, fixed, extra)
    duration = train["duration"].to_numpy(float)
    target = duration - sum((value * train[name].to_numpy(float) for name, value in fixed.items()),
                            np.zeros(len(train)))
    # Relative error: scale each row by 1 / duration (the whole step's, fixed terms included). Columns are
    # scaled to unit size so that the solver converges well on features whose magnitudes differ by orders
    # of magnitude.
    weights = 1.0 / duration
    scaled = design * weights[:, None]
    column_scale = np.maximum(np.abs(scaled).max(axis=0), 1e-30)
    num_physical = design.shape[1] - len(offset_counts)
    lower = np.concatenate([np.zeros(num_physical), np.full(len(offset_counts), -np.inf)])
    plain = [name for name in (*LINEAR_FEATURES, *extra) if name not in knots and name not in fixed]
    for name in DISCOUNT_FEATURES:
        if name in plain:  # a discount on tokens another term already charges for: may be negative
            lower[1 + plain.index(name)] = -np.inf
    solution = lsq_linear(scaled / column_scale, target * weights, bounds=(lower, np.full(design.shape[1], np.inf)),
                          method="bvls").x / column_scale
    # A feature the runs never exercised (all zero) gets no cost: its coefficient is not determined.
    coefficients = {name: float(value) if design[:, 1 + index].any() else 0.0
                    for index, (name, value) in enumerate(zip(plain, solution[1:1 + len(plain)]))}
    coefficients.update(fixed)
    hinges = []
    column = 1 + len(plain)
    for name, feature_knots in knots.items():
        slopes = solution[column:column + len(feature_knots) + 1]
        column += len(feature_knots) + 1
        # Segment slopes as the profile's terms: the first slope per unit, then a hinge at each knot
        # carrying the change of slope there (negative where the cost grows more slowly).
        coefficients[name] = float(slopes[0])
        hinges += [{"feature": name, "knot": float(knot), "coefficient": float(after - before)}
                   for knot, before, after in zip(feature_knots, slopes, slopes[1:])]
    offsets = {count: float(value) for count, value in zip(offset_counts, solution[num_physical:])}
    kind = "piecewise_linear" if hinges else "linear"
    return FitResult(kind, {name: coefficients[name] for name in (*LINEAR_FEATURES, *extra)}, float(solution[0]),
                     hinges, offsets)


def check_fixed_coefficients(fixed: dict[str, float]) -> None:
    """A fixed coefficient must name a plain (hinge-free) feature and be a finite number of seconds per
    unit, non-negative unless the feature is a discount."""
    for name, value in fixed.items():
        if name not in LINEAR_FEATURES or name in (HINGE_FEATURE, CONTEXT_HINGE_FEATURE):
            plain = [feature for feature in LINEAR_FEATURES if feature not in (HINGE_FEATURE, CONTEXT_HINGE_FEATURE)]
            raise ValueError(f"--fix: {name!r} is not a feature that can be fixed (one of: {', '.join(plain)})")
        if not np.isfinite(value) or (value < 0 and name not in DISCOUNT_FEATURES):
            raise ValueError(f"--fix: {name}={value!r} must be a finite, non-negative number of seconds per unit")


def held_out_split(num_steps: int, held_out_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows to fit on and the rows held out: a seeded random split, the same for the same arguments."""
    order = np.random.default_rng(seed).permutation(num_steps)
    cut = int(num_steps * (1 - held_out_fraction))
    if cut < MIN_FIT_STEPS or num_steps - cut < MIN_HELD_OUT_STEPS:
        raise ValueError(f"--held-out {held_out_fraction} leaves {cut} of the {num_steps} steps to fit and "
                         f"{num_steps - cut} to test on; the fit needs at least {MIN_FIT_STEPS} and the test "
                         f"{MIN_HELD_OUT_STEPS}")
    return order[:cut], order[cut:]


def fit_step_model(features: pd.DataFrame, *, held_out_fraction: float = 0.2, seed: int = 0,
                   fixed: dict[str, float] | None = None) -> FitResult:
    """Fit every candidate on a random 80% of the steps and keep the best on the other 20%. ``fixed``:
    coefficients taken as given (``check_fixed_coefficients``)."""
    fixed = dict(fixed or {})
    check_fixed_coefficients(fixed)
    if len(features) < 20:
        raise ValueError(f"calibration needs at least 20 steps with scheduled tokens, got {len(features)}")
    if not 0 < held_out_fraction < 1:
        raise ValueError(f"--held-out must be between 0 and 1 (both excluded), got {held_out_fraction}")
    train_rows, held_out_rows = held_out_split(len(features), held_out_fraction, seed)
    train, held_out = features.iloc[train_rows], features.iloc[held_out_rows]
    tokens = train[HINGE_FEATURE].to_numpy(float)
    token_knots = [[]]
    for quantiles in ((0.5,), (0.25, 0.75), (0.1, 0.5, 0.9)):
        knots = sorted(set(float(np.quantile(tokens, q)) for q in quantiles))
        token_knots.append([knot for knot in knots if knot > tokens.min()])
    # Powers of two: where matrix kernels change regime.
    token_knots.append([float(knot) for knot in (8, 32, 128, 512) if tokens.min() < knot < tokens.max()])
    # The KV read of decodes may cost more per token once it outgrows a cache: knots at high quantiles
    # of the steps that read any.
    reads = train[CONTEXT_HINGE_FEATURE].to_numpy(float)
    reads = reads[reads > 0]
    context_knots = [[]]
    if len(reads) >= 20:
        context_knots += [[float(np.quantile(reads, q))] for q in (0.5, 0.75, 0.9)]
    counts = train[HINGE_FEATURE].astype(int).value_counts()
    small = [int(count) for count in sorted(counts.index) if count <= 16 and counts[count] >= MIN_STEPS_PER_OFFSET]
    candidates = [({HINGE_FEATURE: knots, CONTEXT_HINGE_FEATURE: context}, offsets)
                  for offsets in ([], small) for context in context_knots for knots in token_knots]
    # Adapters or images in the fit: their terms are chosen on the held-out steps that have them; without either,
    # the fit is what it was before LoRA and images existed.
    families = [(column, sets) for column, sets in (("num_lora_tokens", LORA_FEATURE_SETS),
                                                    ("num_encoder_tokens", ENCODER_FEATURE_SETS),
                                                    ("ngram_lookups", SPEC_FEATURE_SETS))
                if train[column].any()]
    best = _best_candidate(train, held_out, candidates, fixed) if not families else \
        _best_term_candidate(train, held_out, candidates, fixed, families)
    best.held_out_has_prefill = held_out["num_prefill_reqs"].to_numpy() > 0
    best.held_out_durations = held_out["duration"].to_numpy(float)
    return best


def _best_candidate(train: pd.DataFrame, held_out: pd.DataFrame, candidates: list, fixed: dict[str, float],
                    extra: tuple[str, ...] = ()) -> FitResult:
    best = None
    for knots, offsets in candidates:
        fit = fit_candidate(train, knots, offsets, fixed, extra)
        fit.held_out_errors = (fit.predict(held_out) - held_out["duration"].to_numpy()) / held_out["duration"].to_numpy()
        fit.train_errors = (fit.predict(train) - train["duration"].to_numpy()) / train["duration"].to_numpy()
        if best is None or np.median(np.abs(fit.held_out_errors)) < np.median(np.abs(best.held_out_errors)) * 0.98:
            best = fit  # a more complex candidate must win clearly (2%) to be kept
    return best


def _best_term_candidate(train: pd.DataFrame, held_out: pd.DataFrame, candidates: list, fixed: dict[str, float],
                         families: list[tuple[str, tuple]]) -> FitResult:
    """The best base candidate with each combination of the families' term sets (LORA_FEATURE_SETS,
    ENCODER_FEATURE_SETS: one set of each family present); among them, the one whose fit times the held-out steps
    with any of the families' work best, a later (richer) combination kept only if it wins clearly."""
    steps = np.zeros(len(held_out), dtype=bool)
    for column, _ in families:
        steps |= held_out[column].to_numpy() > 0
    if not steps.any():
        what = " or ".join(FAMILY_WORK[column] for column, _ in families)
        raise ValueError(f"the held-out steps have no {what}, so their terms cannot be judged: record more such "
                         "steps, or hold out a larger fraction")
    best, best_error, errors = None, np.inf, {}
    for combination in itertools.product(*(sets for _, sets in families)):
        names = tuple(name for term_set in combination for name in term_set)
        fit = _best_candidate(train, held_out, candidates, fixed, names)
        error = float(np.median(np.abs(fit.held_out_errors[steps])))
        errors["+".join(names)] = error
        if best is None or error < best_error * 0.98:
            best, best_error = fit, error
    for column, _ in families:
        count = int((held_out[column].to_numpy() > 0).sum())
        if column == "num_lora_tokens":
            best.lora_feature_errors, best.num_held_out_lora_steps = errors, count
        elif column == "num_encoder_tokens":
            best.encoder_feature_errors, best.num_held_out_encoder_steps = errors, count
        else:
            best.spec_feature_errors, best.num_held_out_spec_steps = errors, count
    return best
