"""Speculative decoding simulated with a calibrated profile: whether the profile prices it, and with what rates.

A profile fitted on runs that speculate with n-gram lookups (``sim.calibrate`` on such recordings, beside plain
ones) has the verification terms (``num_spec_tokens``, and ``spec_attention_work`` when it won on held-out steps:
the calibrated cost model reads them from each step's features) and the lookups' own cost (``ngram_lookup_s``,
per request that sampled, which sim/speculation.py adds after the step's pass in place of its assumed 5 us).
Other proposers (a draft model, an EAGLE head, MTP) run a network the profile has no terms for, and a profile
fitted without speculating runs prices no draft row: both are refused, naming what would price them.

The simulation's acceptance and proposals are inputs, not predictions: a workload states them
(``acceptance_rate``, ``proposal_rate``). ``sim.validate`` compares a recorded n-gram run with the simulation at
the rates that run measured (``measured_speculation``), so that its comparison is of the timing the profile
predicts, as a user who measured their traffic's acceptance would simulate it.
"""

from __future__ import annotations

from pathlib import Path

from sim.cost_models import AnalyticalCostModel, CalibratedCostModel
from sim.cost_models.calibrated import StepProfile, load_profile
from sim.profile_match import SHIPPED_PROFILES_DIR
from sim.speculation import NGRAM_PROPOSE_S_PER_REQUEST, SpeculationSetup

# The shipped CPU profile fitted on n-gram speculating runs beside plain ones (never a default; named in refusals).
NGRAM_PROFILE = SHIPPED_PROFILES_DIR / "cpu-small-float32-ngram.json"
HOW_TO_CALIBRATE = (
    "record real runs that speculate with n-gram lookups beside plain ones on the same machine, e.g. `python -m "
    "sim.run cpu_ngram_calibrate --executor real --out runs/ngram-1` (greedy requests, workload.temperature 0, so "
    "that drafts are accepted) and the same with `--set engine.speculative_decoding=null --out runs/plain-1`, then "
    "`python -m sim.calibrate runs/ngram-1 runs/plain-1 -o ngram-profile.json`")


def check_profile_prices_speculation(profile: StepProfile, source: str, method: str) -> None:
    """A ValueError naming engine.speculative_decoding when ``profile`` cannot price drafts proposed by ``method``."""
    field_name = "engine.speculative_decoding"
    if method != "ngram":
        raise ValueError(f"{field_name}.method {method!r}: a calibrated profile prices n-gram lookups only (a draft "
                         "model's or head's passes have no terms in it); simulate this method with the analytical "
                         "cost model")
    if not profile.prices_speculation:
        raise ValueError(f"{field_name}: the calibrated profile {source} was fitted on steps without draft tokens and "
                         f"has no term for verifying them (sim/data/profiles/{NGRAM_PROFILE.name} is one for the "
                         f"small model on the CPU): {HOW_TO_CALIBRATE}")


def ngram_lookup_cost(cost_model, section) -> float:
    """What one n-gram lookup costs the simulated engine of ``cost_model`` (engine.speculative_decoding ``section``):
    the analytical model's assumed 5 us, or the profile's fitted cost at its speed; a ValueError naming the field when
    the cost model cannot price the drafts at all."""
    if isinstance(cost_model, CalibratedCostModel):
        check_profile_prices_speculation(cost_model.profile, cost_model.path or "(inline)", section.method)
        return cost_model.ngram_lookup_s
    if not isinstance(cost_model, AnalyticalCostModel):
        raise ValueError(f"engine.speculative_decoding: num_speculative_tokens {section.num_speculative_tokens} needs "
                         f"the analytical cost model or a calibrated profile fitted on n-gram runs; the cost model "
                         f"{cost_model.name} has no term for verifying drafts")
    return NGRAM_PROPOSE_S_PER_REQUEST


def refuse_speculation_without_profile(workload, profile: Path | str | None) -> None:
    """Before recording a speculating workload: a ValueError unless ``profile`` prices its drafts (None, the default
    profiles, do not)."""
    section = workload.engine.speculative_decoding
    if section is None or not section.num_speculative_tokens:
        return
    if profile is None:
        raise ValueError(f"engine.speculative_decoding: num_speculative_tokens {section.num_speculative_tokens}: a "
                         "speculating workload is compared by sim.validate only with --profile, a profile fitted on "
                         "n-gram speculating runs (the default profiles have no term for draft rows; "
                         f"sim/data/profiles/{NGRAM_PROFILE.name} is one for the small model on the CPU): "
                         f"{HOW_TO_CALIBRATE}; then `python -m sim.validate WORKLOAD --profile ngram-profile.json`")
    check_profile_prices_speculation(load_profile(profile), str(profile), section.method)


def measured_speculation(summary: dict, seed: int, lookup_s: float) -> SpeculationSetup:
    """The simulation of a recorded n-gram run: its drafts per step, the acceptance and proposal rates it measured
    by position (its summary's ``spec_decoding``), and the profile's lookup cost ``lookup_s``."""
    measured = summary.get("spec_decoding") or {}
    rates = measured.get("proposal_rate_per_position")
    if rates is None or "num_judged_tokens_per_position" not in measured:
        raise ValueError("the recording's summary lacks spec_decoding's proposal and judged counts by position "
                         "(recorded before this version measured them): record it again")
    return SpeculationSetup(int(measured["num_speculative_tokens"]),
                            tuple(measured["conditional_acceptance_per_position"]), "ngram", seed,
                            proposal_by_position=tuple(rates), ngram_propose_s_per_request=lookup_s)
