"""What a verification of drafts costs (speculative decoding): step features, the roofline, the proposers."""

from __future__ import annotations

import pytest

from engine.core import EngineCore, Scheduler
from sim.cost_models import AnalyticalCostModel, StepBatch, StepFeatures, step_features
from sim.engine_requests import make_request
from sim.engine_setup import build_setup
from sim.hardware import resolve_hardware
from sim.model_presets import resolve_model
from sim.scheduled_batch import scheduler_output_features, step_batch
from sim.speculation import NGRAM_PROPOSE_S_PER_REQUEST, SpeculationSetup, decode_features, proposer_seconds
from sim.speculative_executor import SpeculatingExecutor
from workloads import example_path, load_workload


def h100(model: str = "llama-3-8b", tensor_parallel_size: int = 1) -> AnalyticalCostModel:
    return AnalyticalCostModel(resolve_model(model), resolve_hardware("h100-sxm"), "bfloat16", tensor_parallel_size)


def verifications(num_reqs: int, context: int, num_drafts: int) -> StepBatch:
    return StepBatch([num_drafts + 1] * num_reqs, [context] * num_reqs, num_spec_tokens=[num_drafts] * num_reqs)


def test_a_verification_is_a_decode_with_more_query_rows():
    # A decode (context 10), a verification of 3 drafts after 20 computed tokens, a fresh 5-token prompt.
    features = step_features(StepBatch([1, 4, 5], [10, 20, 0], num_spec_tokens=[0, 3, 0]))
    assert features == StepFeatures(
        num_reqs=3, num_tokens=10, num_prefill_reqs=1, num_prefill_tokens=5, num_decode_reqs=2,
        decode_context_tokens=11 + 24,  # the verification reads its KV once, up to its last draft
        prefill_context_tokens=0, prefill_attention_work=15, max_seq_len=24,
        prefill_attention_dense_work=25, prefill_attention_sliced_work=25,
        num_spec_tokens=3,
        # Its rows score 21, 22, 23, 24 keys: 90 pairs, 66 more than the 24 KV tokens counted once.
        spec_attention_work=(21 + 22 + 23 + 24) - 24,
        # One verification, reading those 24 KV tokens.
        num_spec_reqs=1, spec_context_tokens=24)
    # Without drafts the features are what they always were.
    plain = StepBatch([1, 4, 5], [10, 20, 0])
    assert step_features(plain) == step_features(StepBatch([1, 4, 5], [10, 20, 0], num_spec_tokens=[0, 0, 0]))
    assert step_features(plain).num_prefill_reqs == 2 and step_features(plain).num_spec_tokens == 0
    with pytest.raises(ValueError, match="verifying 3 draft tokens must be scheduled 4 tokens, got 2"):
        step_features(StepBatch([2], [20], num_spec_tokens=[3]))
    with pytest.raises(ValueError, match="num_spec_tokens 1"):
        step_features(StepBatch([1, 1], [2, 3], num_spec_tokens=[0]))


def test_a_small_batch_verifies_drafts_for_little_more_than_a_decode():
    # Memory-bound: the weights and the KV are read once whatever the rows; the extra rows cost lm_head's
    # and the sampler's passes and little else.
    model = h100()
    decode = model.step_time(verifications(4, 1000, 0))
    verify = model.step_time(verifications(4, 1000, 3))
    assert decode < verify < 1.1 * decode
    breakdown, plain = model.breakdown(verifications(4, 1000, 3)), model.breakdown(verifications(4, 1000, 0))
    assert breakdown["sampling"] == pytest.approx(4 * plain["sampling"])  # logits sampled at every row
    assert breakdown["attention_prefill"] == 0.0  # not priced as a prompt chunk


def test_a_large_batch_pays_for_every_verification_row():
    # Past the ridge point the linear layers compute every row: 256 verifications of 3 drafts are 1024 rows.
    model = h100()
    decode, verify = model.breakdown(verifications(256, 1000, 0)), model.breakdown(verifications(256, 1000, 3))
    assert verify["linear_layers"] > 3 * decode["linear_layers"]
    assert verify["attention_decode"] == pytest.approx(decode["attention_decode"], rel=0.02)  # KV read once
    # Most of a decode step reads KV here, so the whole step costs less than twice as much: still a gain at an
    # acceptance length of 2, but a loss below it.
    assert 1.5 * sum(decode.values()) < sum(verify.values()) < 2 * sum(decode.values())


def test_attention_of_many_rows_turns_compute_bound():
    # A verification's attention is the slower of scoring every row and reading the KV once.
    model = h100()
    features = step_features(verifications(1, 4000, 3))
    few = model.component_times(features)[2]
    assert few == pytest.approx(features.decode_context_tokens * model._decode_s_per_kv_token
                                + 4 * model._decode_s_per_request)
    wide = step_features(verifications(1, 4000, 31))  # 32 rows: still memory-bound for Llama-3-8B (~44)
    assert model.component_times(wide)[2] == pytest.approx(wide.decode_context_tokens * model._decode_s_per_kv_token
                                                           + 32 * model._decode_s_per_request)
    seventy = h100("llama-3-70b", tensor_parallel_size=4)  # ~22 rows per KV token on one GPU's shard
    wide_70 = seventy.component_times(wide)[2]
    pairs = wide.decode_context_tokens + wide.spec_attention_work
    assert wide_70 == pytest.approx(pairs * seventy._decode_s_per_pair + 32 * seventy._decode_s_per_request)


def test_tensor_parallel_logits_gather_counts_the_verification_rows():
    model = h100("llama-3-70b", tensor_parallel_size=4)
    plain = model.breakdown(verifications(8, 500, 0))["tensor_parallel_communication"]
    verify = model.breakdown(verifications(8, 500, 4))["tensor_parallel_communication"]
    assert verify > plain


def speculating_workload(*overrides):
    return load_workload(example_path("chat"), overrides=[
        "workload.num_requests=60", "engine.max_num_batched_tokens=512", "engine.long_prefill_token_threshold=200",
        "engine.speculative_decoding={num_speculative_tokens: 3, acceptance_rate: 0.6}", *overrides])


def test_one_pass_features_equal_the_definition_when_speculating():
    setup = build_setup(speculating_workload())
    engine = EngineCore(Scheduler(setup.scheduler_config, setup.cache_config),
                        SpeculatingExecutor(setup.cost_model, setup.speculation))
    params = {}
    for spec in setup.requests:
        engine.add_request(make_request(spec, params))
    verified = 0
    while engine.has_work():
        output = engine.scheduler.schedule()
        if output.total_num_scheduled_tokens:
            features = scheduler_output_features(output)
            assert features == step_features(step_batch(output))
            verified += features.num_spec_tokens
        engine.scheduler.update_from_output(output, engine.executor.execute_model(output))
    assert verified > 1000


def test_proposers_cost_what_the_documented_formulas_say():
    model, draft = h100(), h100("llama-3.2-1b")
    features = step_features(StepBatch([1, 4, 100], [500, 600, 0], num_spec_tokens=[0, 3, 0]))
    ngram = SpeculationSetup(3, (0.7, 0.7, 0.7), "ngram", 0)
    assert proposer_seconds(ngram, features, 3, 1500, 700) == 3 * NGRAM_PROPOSE_S_PER_REQUEST
    drafting = SpeculationSetup(3, (0.7, 0.7, 0.7), "draft_model", 0, draft)
    overhead = draft.hardware.step_overhead_s
    expected = draft.step_time_from_features(features) - overhead
    for index in (1, 2):  # k - 1 decode passes after the first over the step's tokens
        expected += draft.step_time_from_features(decode_features(3, 1500 + 3 * index, 700 + index)) - overhead
    assert proposer_seconds(drafting, features, 3, 1500, 700) == pytest.approx(expected)
    # A 1B draft costs a fraction of the 8B target's step, three passes and all.
    assert 0.2 * model.step_time_from_features(features) < expected < model.step_time_from_features(features)
