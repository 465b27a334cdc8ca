"""Calibrating n-gram speculative decoding: the verification terms and the lookups' cost fitted from recorded steps,
the profile that carries them, and the simulator and sim.validate that price a speculating workload with it
(sim/calibrated_speculation.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim.calibration_fit import SPEC_FEATURE_SETS, fit_step_model, step_feature_frame
from sim.cost_models import CalibratedCostModel, load_profile, save_profile
from sim.engine_setup import SetupError, build_setup
from sim.profile_match import SHIPPED_PROFILES_DIR
from workloads import load_workload

# Known costs (seconds) of a synthetic engine: per step, per token, per request, per decode KV token, per draft row
# beyond its token cost, per query-key pair of a draft row, and per n-gram lookup.
TRUE = {"intercept": 0.004, "num_tokens": 2.5e-3, "num_reqs": 3e-4, "decode_context_tokens": 1e-6,
        "num_spec_tokens": 4e-4, "spec_attention_work": 2e-8, "ngram_lookups": 3e-5}


def synthetic_steps(num_steps: int = 800, seed: int = 1, speculating: bool = True) -> pd.DataFrame:
    """Recorded-looking decode steps whose durations are the TRUE costs times 0.1% noise; a speculating run's
    requests carry 0-3 drafts each and sampled (its lookups: one per request that sampled)."""
    rng = np.random.default_rng(seed)
    decodes = rng.integers(1, 40, num_steps)
    context = decodes * rng.integers(20, 900, num_steps)
    drafts = rng.binomial(3 * decodes, rng.random(num_steps)) if speculating else np.zeros(num_steps, int)
    # A draft row scores the request's context: about the mean context per request, per draft.
    spec_work = drafts * (context // np.maximum(decodes, 1)) if speculating else np.zeros(num_steps, int)
    # Some steps hold a request whose last prompt chunk is not done: it samples nothing (no lookup).
    partial = np.where(rng.random(num_steps) < 0.3, 1, 0)
    tokens = decodes + drafts + 40 * partial
    num_reqs = decodes + partial
    duration = (TRUE["intercept"] + TRUE["num_tokens"] * tokens + TRUE["num_reqs"] * num_reqs
                + TRUE["decode_context_tokens"] * context + TRUE["num_spec_tokens"] * drafts
                + TRUE["spec_attention_work"] * spec_work + (TRUE["ngram_lookups"] * decodes if speculating else 0))
    duration = duration * (1 + rng.normal(0, 0.001, num_steps))
    sampled = [[1] * int(count) + [0] * int(extra) for count, extra in zip(decodes, partial)]
    return pd.DataFrame({
        "duration": duration, "num_scheduled_tokens": tokens, "num_reqs": num_reqs,
        "num_prefill_reqs": partial, "num_prefill_tokens": 40 * partial, "num_decode_reqs": decodes,
        "decode_context_tokens": context, "prefill_context_tokens": 0, "prefill_attention_work": 0,
        "max_seq_len": 1000, "num_spec_tokens": drafts, "spec_attention_work": spec_work,
        "sampled_token_counts": sampled})


def test_the_fit_recovers_the_verification_and_lookup_costs():
    features = pd.concat([step_feature_frame(synthetic_steps(), ngram_lookups=True),
                          step_feature_frame(synthetic_steps(seed=2, speculating=False))], ignore_index=True)
    assert features["ngram_lookups"].max() > 0 and (features["ngram_lookups"] <= features["num_reqs"]).all()
    fit = fit_step_model(features)
    for name in ("num_tokens", "num_spec_tokens", "ngram_lookups"):
        assert fit.coefficients[name] == pytest.approx(TRUE[name], rel=0.1), name
    assert set(fit.spec_feature_errors) == {"+".join(names) for names in SPEC_FEATURE_SETS}
    assert fit.error_summary()["spec_steps_median_ape"] < 0.01
    # Without the lookups' flag a run's steps have none: the plain fit has no speculative terms at all.
    plain = fit_step_model(step_feature_frame(synthetic_steps(seed=3, speculating=False)))
    assert not plain.spec_feature_errors and "num_spec_tokens" not in plain.coefficients


def test_a_speculating_runs_steps_need_their_sampled_counts():
    steps = synthetic_steps().drop(columns="sampled_token_counts")
    with pytest.raises(ValueError, match="lacks 'sampled_token_counts'"):
        step_feature_frame(steps, ngram_lookups=True)


def _profile(path, lookup_s=3e-5, spec=True):
    coefficients = {"num_tokens": 2.5e-3, "num_reqs": 3e-4, "decode_context_tokens": 1e-6}
    if spec:
        coefficients.update(num_spec_tokens=4e-4, spec_attention_work=2e-8)
    provenance = {"hardware": "cpu", "model": "servesim-small", "dtype": "float32", "created": "2026-12-02T00:00:00"}
    return save_profile(path, coefficients, 0.004, provenance, ngram_lookup_s=lookup_s if spec else None)


@pytest.mark.parametrize("edit, message", [
    (lambda data: data.update(ngram_lookup_s=-1.0), "'ngram_lookup_s' must be >= 0"),
    (lambda data: data.update(ngram_lookup_s="fast"), "'ngram_lookup_s' must be a finite number"),
    (lambda data: (data.update(features=data["features"][:3]),
                   [data["coefficients"].pop(name) for name in ("num_spec_tokens", "spec_attention_work")]),
     "'ngram_lookup_s' comes only with the verification terms"),
])
def test_a_bad_lookup_cost_in_a_profile_is_named(tmp_path, edit, message):
    path = tmp_path / "profile.json"
    _profile(path)
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=message):
        load_profile(path)


def _ngram_workload(*more):
    return load_workload("workloads/examples/cpu_chat.yaml", overrides=[
        "workload.num_requests=60",
        "engine.speculative_decoding={method: ngram, num_speculative_tokens: 3, acceptance_rate: 0.7, "
        "proposal_rate: [0.8, 0.5, 0.5]}", *more])


def test_a_profile_fitted_on_ngram_runs_prices_the_drafts_and_the_lookups(tmp_path):
    from sim.run_pipeline import run_simulation

    path = tmp_path / "ngram.json"
    _profile(path, lookup_s=3e-5)
    setup = build_setup(_ngram_workload(), str(path))
    assert isinstance(setup.cost_model, CalibratedCostModel)
    assert setup.speculation.ngram_propose_s_per_request == 3e-5
    assert setup.describe()["speculative_decoding"]["ngram_propose_s_per_request"] == 3e-5
    faster = tmp_path / "faster-lookups.json"
    _profile(faster, lookup_s=0.0)
    slow = run_simulation(_ngram_workload(), None, cost_model=str(path)).summary
    fast = run_simulation(_ngram_workload(), None, cost_model=str(faster)).summary
    # The same decisions (acceptance and proposals are draws), every step longer by its lookups.
    assert slow["spec_decoding"]["num_accepted_tokens"] == fast["spec_decoding"]["num_accepted_tokens"]
    assert slow["tpot_ms"]["p50"] > fast["tpot_ms"]["p50"]


def test_a_profile_that_cannot_price_the_drafts_is_refused_by_name(tmp_path):
    plain = tmp_path / "plain.json"
    _profile(plain, spec=False)
    with pytest.raises(SetupError, match="engine.speculative_decoding: the calibrated profile .*plain.json was fitted "
                                         "on steps without draft tokens.*cpu-small-float32-ngram.json"):
        build_setup(_ngram_workload(), str(plain))
    ngram = tmp_path / "ngram.json"
    _profile(ngram)
    with pytest.raises(SetupError, match="engine.speculative_decoding.method 'draft_model': a calibrated profile "
                                         "prices n-gram lookups only"):
        build_setup(_ngram_workload("engine.speculative_decoding.method=draft_model",
                                    "engine.speculative_decoding.draft_model=small",
                                    "engine.speculative_decoding.proposal_rate=1"), str(ngram))


def test_validate_refuses_a_speculating_workload_without_a_profile_that_prices_it(tmp_path):
    from sim.validate import validate

    workload = tmp_path / "w.yaml"
    workload.write_text(open("workloads/examples/cpu_ngram_calibrate.yaml").read())
    with pytest.raises(ValueError, match="compared by sim.validate only with --profile.*cpu-small-float32-ngram.json"):
        validate(workload, tmp_path / "out")
    with pytest.raises(ValueError, match="fitted on steps without draft tokens"):
        validate(workload, tmp_path / "out", profile=SHIPPED_PROFILES_DIR / "cpu-small-float32.json")


NGRAM_RUNS = Path(__file__).resolve().parents[2] / "sim" / "data" / "runs" / "cpu-small-float32-ngram"
NGRAM_PROFILE = SHIPPED_PROFILES_DIR / "cpu-small-float32-ngram.json"
NGRAM_CALIBRATION = ("ngram-calibrate-1", "ngram-calibrate-2", "ngram-calibrate-3", "plain-calibrate-1",
                     "plain-calibrate-2")


def test_the_shipped_ngram_profile_is_what_calibrate_fits_on_its_shipped_runs(tmp_path):
    from sim.calibrate import main as calibrate_main

    out = tmp_path / "profile.json"
    assert calibrate_main([*(str(NGRAM_RUNS / run) for run in NGRAM_CALIBRATION), "-o", str(out)]) == 0
    fitted, shipped = json.loads(out.read_text()), json.loads(NGRAM_PROFILE.read_text())
    assert fitted["features"] == shipped["features"] and "num_spec_tokens" in fitted["features"]
    assert fitted["coefficients"] == pytest.approx(shipped["coefficients"], rel=1e-6, abs=1e-12)
    assert fitted["ngram_lookup_s"] == pytest.approx(shipped["ngram_lookup_s"], rel=1e-6, abs=1e-12)
    assert shipped["provenance"]["speculative_decoding"]["num_speculative_tokens"] == [2, 3, 4]


def test_the_shipped_ngram_profile_is_never_the_default_and_validates_a_shipped_ngram_run(tmp_path, capsys):
    from tests.sim.shipped_validation import check_named_profile_validates

    check_named_profile_validates(NGRAM_RUNS / "ngram-chat-1", NGRAM_PROFILE, NGRAM_RUNS / "plain-calibrate-1",
                                  "was fitted on steps without draft tokens", tmp_path, capsys)
    out = tmp_path / "validate"
    # Simulated at the rates the recording measured, the drafts come out as many, up to the draws.
    simulated = json.loads((out / "sim" / "summary.json").read_text())["spec_decoding"]
    recorded = json.loads((NGRAM_RUNS / "ngram-chat-1" / "summary.json").read_text())["spec_decoding"]
    assert simulated["mean_acceptance_length"] == pytest.approx(recorded["mean_acceptance_length"], rel=0.05)


def test_a_shipped_ngram_run_replays_exactly(tmp_path):
    from sim.replay import run_replay

    _, report = run_replay(NGRAM_RUNS / "ngram-shared-prefix-1", tmp_path / "replay")
    assert report.identical, report.describe()


def test_the_whatif_example_runs_on_the_shipped_ngram_profile(tmp_path):
    """cpu_ngram_whatif with the shipped n-gram profile: drafts shorten TPOT at low load, more drafts more so."""
    from sim.run import main as sim_run_main

    out = tmp_path / "whatif"
    assert sim_run_main(["cpu_ngram_whatif", "--cost-model", str(NGRAM_PROFILE), "--set",
                         "sweep={workload.arrival.rate: [1], engine.speculative_decoding.num_speculative_tokens: "
                         "[0, 1, 2, 4]}", "--set", "workload.num_requests=120", "--out", str(out), "--no-dashboard",
                         "--quiet"]) == 0
    table = pd.read_csv(out / "sweep.csv")
    tpot = table["tpot_ms_p50"].tolist()
    assert tpot == sorted(tpot, reverse=True) and tpot[-1] < 0.8 * tpot[0]
    assert table["spec_acceptance_length"].iloc[1:].is_monotonic_increasing
