"""A speculating real run (``--executor real`` with ``engine.speculative_decoding``: the n-gram proposer, a draft
model or an EAGLE head) and its replay: the replay keeps and proposes as many drafts per step as the real runner did
(sim/recorded_drafts.py) and must take every scheduling decision the real run took (with a draft model, the lookahead
slots its requests hold too)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from analysis import read_run  # noqa: E402
from sim.real_engine import SetupError, build_real_engine  # noqa: E402
from sim.real_run import run_real  # noqa: E402
from sim.replay import run_replay  # noqa: E402
from workloads import load_workload  # noqa: E402

from tests.sim.test_real_runs import WORKLOAD  # noqa: E402

SPECULATING = dict(WORKLOAD, engine=dict(WORKLOAD["engine"], speculative_decoding={
    "num_speculative_tokens": 3, "acceptance_rate": 0.6, "prompt_lookup_min": 1, "prompt_lookup_max": 3}))


DRAFTING = dict(WORKLOAD, engine=dict(WORKLOAD["engine"], speculative_decoding={
    "num_speculative_tokens": 3, "acceptance_rate": 0.6, "method": "draft_model", "draft_model": "tiny"}))


@pytest.fixture(scope="module")
def speculating_run(tmp_path_factory):
    return _greedy_real_run(SPECULATING, tmp_path_factory.mktemp("spec_real") / "run")


@pytest.fixture(scope="module")
def drafting_run(tmp_path_factory):
    """The tiny model drafting for itself: every greedy draft is accepted."""
    return _greedy_real_run(DRAFTING, tmp_path_factory.mktemp("draft_real") / "run")


def _greedy_real_run(spec, out):
    # Greedy requests (workload.temperature 0): the tiny random model's greedy outputs fall into loops, where drafts
    # are accepted (at the default temperature 1 over its near-uniform distribution nearly none would be).
    workload = load_workload(dict(spec, workload=dict(spec["workload"], temperature=0)))
    real = build_real_engine(workload, model="tiny", threads=1)
    result = run_real(workload, out, real.engine, vocab_size=real.vocab_size,
                      reserved_token_ids=real.reserved_token_ids, executor_info=real.info)
    manager = real.engine.scheduler.kv_cache_manager
    assert result.summary["num_finished"] == 40 and manager.num_free_blocks == manager.num_usable_blocks
    return out


def test_the_real_run_verifies_drafts_and_keeps_some(speculating_run):
    run = read_run(speculating_run)
    stats = run.summary["spec_decoding"]
    assert stats["num_drafts"] > 50 and 0 < stats["num_accepted_tokens"] < stats["num_draft_tokens"]
    # Every request still produced exactly its output length.
    assert (run.requests["num_output_tokens"] > 0).all()
    assert run.steps["sampled_token_counts"].map(max).max() > 1  # some steps kept drafts


def test_an_eagle_heads_real_run_and_its_replay_take_the_same_decisions(tmp_path):
    """An EAGLE head (a copying one, which drafts the last token again) in a real run: its requests hold lookahead slots
    as a draft model's do, and the replay takes every decision it took. (The tiny model seldom repeats a token on these
    prompts, so few drafts if any are kept: the n-gram run above covers kept drafts in a replay.)"""
    from engine.models import default_model_path
    from engine.models.eagle import make_eagle_head

    head = make_eagle_head(default_model_path("tiny"), tmp_path / "head", copying=True)
    spec = dict(WORKLOAD, engine=dict(WORKLOAD["engine"], speculative_decoding={
        "num_speculative_tokens": 3, "acceptance_rate": 0.6, "method": "eagle", "draft_model": str(head)}))
    run = _greedy_real_run(spec, tmp_path / "run")
    stats = read_run(run).summary["spec_decoding"]
    assert stats["num_drafts"] > 50 and stats["num_accepted_tokens"] < stats["num_draft_tokens"]
    result, report = run_replay(run, tmp_path / "replay")
    assert report.identical, report.describe()


def test_replay_of_a_speculating_run_takes_the_same_decisions(speculating_run, tmp_path):
    result, report = run_replay(speculating_run, tmp_path / "replay")
    assert report.identical, report.describe()
    replayed = read_run(tmp_path / "replay").summary["spec_decoding"]
    recorded = read_run(speculating_run).summary["spec_decoding"]
    assert {key: replayed[key] for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")} == \
        {key: recorded[key] for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")}


def test_a_draft_models_real_run_and_its_replay_take_the_same_decisions(drafting_run, tmp_path):
    recorded = read_run(drafting_run).summary["spec_decoding"]
    assert recorded["num_drafts"] > 50 and recorded["num_accepted_tokens"] == recorded["num_draft_tokens"]
    result, report = run_replay(drafting_run, tmp_path / "replay")
    assert report.identical, report.describe()


@pytest.mark.parametrize("section, message", [
    ({"method": "mtp"}, "method: 'mtp' is simulated only"),
    ({"method": "eagle3"}, "draft_model: method 'eagle3' needs the head's checkpoint folder in a real run"),
    ({"method": "eagle", "draft_model": "llama-3.2-1b"}, "draft_model: 'llama-3.2-1b' names no checkpoint"),
    ({"method": "draft_model", "draft_model": "llama-3.2-1b"}, "draft_model: 'llama-3.2-1b' names no checkpoint"),
])
def test_what_a_real_run_cannot_draft_with_is_refused(section, message):
    workload = load_workload(dict(SPECULATING, engine=dict(SPECULATING["engine"], speculative_decoding={
        "num_speculative_tokens": 3, "acceptance_rate": 0.6, **section})))
    with pytest.raises(SetupError, match=message):
        build_real_engine(workload, model="tiny", threads=1)


def test_validate_refuses_a_speculating_run_with_a_profile_fitted_without_drafts(speculating_run, tmp_path):
    from sim.profile_match import SHIPPED_PROFILES_DIR
    from sim.validate import simulate_like

    with pytest.raises(ValueError, match="engine.speculative_decoding: the calibrated profile .* was fitted on steps "
                                         "without draft tokens"):
        simulate_like(speculating_run, SHIPPED_PROFILES_DIR / "cpu-small-float32.json", tmp_path / "sim")


def test_a_profile_fitted_on_the_ngram_run_and_a_plain_one_simulates_the_run_at_its_measured_rates(
        speculating_run, tmp_path):
    """sim.calibrate on an n-gram run beside a plain one (the same traffic without drafts) gives the verification
    terms and the lookups' cost; sim.validate simulates the n-gram run at the acceptance and proposal rates it
    measured, so the simulated drafts per verification are the recording's, up to the draws."""
    from sim.calibrate import calibrate
    from sim.cost_models import load_profile
    from sim.validate import simulate_like

    plain = _greedy_real_run(WORKLOAD, tmp_path / "plain")
    profile_path = tmp_path / "ngram.json"
    calibrate([speculating_run, plain], profile_path)
    profile = load_profile(profile_path)
    assert profile.prices_speculation and profile.ngram_lookup_s >= 0
    assert profile.provenance["speculative_decoding"]["num_speculative_tokens"] == [3]
    summary = simulate_like(speculating_run, profile_path, tmp_path / "sim")
    recorded = read_run(speculating_run).summary["spec_decoding"]
    simulated = summary["config"]["speculative_decoding"]
    assert simulated["acceptance_by_position"] == recorded["conditional_acceptance_per_position"]
    assert simulated["proposal_by_position"] == recorded["proposal_rate_per_position"]
    assert simulated["ngram_propose_s_per_request"] == profile.ngram_lookup_s
    assert summary["num_finished"] == 40
    drafts_per_lookup = [stats["num_draft_tokens"] / stats["num_proposals"] for stats in (summary["spec_decoding"],
                                                                                          recorded)]
    assert drafts_per_lookup[0] == pytest.approx(drafts_per_lookup[1], rel=0.25)


def test_calibration_refuses_a_run_that_drafts_with_a_model(drafting_run, tmp_path):
    from sim.calibrate import calibrate

    with pytest.raises(ValueError, match="method 'draft_model': calibration prices n-gram lookups only"):
        calibrate([drafting_run], tmp_path / "profile.json")


def test_the_report_gives_the_measured_acceptance_by_position_for_a_simulation(speculating_run):
    from rich.console import Console

    from analysis.report import summary_renderable

    summary = read_run(speculating_run).summary
    console = Console(width=160, record=True)
    console.print(summary_renderable(summary))
    expected = "[" + ", ".join(f"{rate:.2f}" for rate in summary["spec_decoding"]["conditional_acceptance_per_position"]) + "]"
    text = console.export_text()
    assert "acceptance by position (acceptance_rate)" in text and expected in text
    # The n-gram lookup finds nothing for some requests and fewer than 3 tokens for others: the measured proposal
    # rates, for proposal_rate.
    offered = summary["spec_decoding"]["proposal_rate_per_position"]
    assert 0 < min(offered) < 1 and summary["spec_decoding"]["num_proposals"] > summary["spec_decoding"]["num_drafts"]
    assert "proposals by position (proposal_rate)" in text
    assert "[" + ", ".join(f"{rate:.2f}" for rate in offered) + "]" in text
