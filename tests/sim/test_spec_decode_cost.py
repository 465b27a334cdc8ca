"""What a verification of drafts costs (speculative decoding): step features and the roofline."""

from __future__ import annotations

import pytest

from sim.cost_models import AnalyticalCostModel, StepBatch, StepFeatures, step_features
from sim.hardware import resolve_hardware
from sim.model_presets import resolve_model


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
        spec_attention_work=(21 + 22 + 23 + 24) - 24)
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
