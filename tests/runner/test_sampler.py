"""The sampler, stage by stage against direct computations, and end to end."""

import math

import pytest
import torch
from scipy import stats

from engine.core.sampling_params import SamplingParams
from engine.runner.sampler import Sampler, SamplingMetadata, make_generator
from engine.runner.sampler.logits_processors import (apply_allowed_token_ids, apply_bad_words,
                                                     apply_logit_bias, apply_min_tokens)
from engine.runner.sampler.penalties import apply_penalties
from engine.runner.sampler.topk_topp import apply_min_p, apply_top_k_top_p

INF = float("inf")


def meta(params, outputs=None, prompts=None, generators=None, bad_words=None, eos=None, vocab=8):
    outputs = outputs if outputs is not None else [[] for _ in params]
    return SamplingMetadata.from_requests(params, outputs, prompts, generators, bad_words, eos, vocab_size=vocab)


def kept(row):
    return set(torch.nonzero(torch.isfinite(row)).flatten().tolist())


# ---- truncation -------------------------------------------------------------------------------------

def test_top_k_keeps_exactly_the_k_largest():
    torch.manual_seed(0)
    logits = torch.randn(5, 50)
    top_k = torch.tensor([1, 3, 10, 0, 50])
    out = apply_top_k_top_p(logits.clone(), top_k, None)
    for row, k in enumerate(top_k.tolist()):
        k = k or 50
        assert kept(out[row]) == set(logits[row].topk(k).indices.tolist())
        finite = torch.isfinite(out[row])
        assert torch.equal(out[row][finite], logits[row][finite])  # survivors untouched


def test_top_k_keeps_tokens_tied_with_the_kth_largest():
    # As vLLM and Hugging Face do; keeping exactly k picked among the tied tokens by sort order, so
    # top_k=1 could even drop the token greedy sampling takes. Ties are common with bfloat16 logits.
    logits = torch.tensor([[1.0, 3.0, 3.0, 3.0, 0.5], [2.0, 2.0, 1.0, 1.0, 0.0]])
    out = apply_top_k_top_p(logits.clone(), torch.tensor([1, 3]), None)
    assert kept(out[0]) == {1, 2, 3}
    assert kept(out[1]) == {0, 1, 2, 3}


def test_top_k_beyond_the_vocabulary_keeps_every_token_beside_a_small_one():
    # top_k has no upper bound (as in vLLM): one past the vocabulary keeps every token. Put in one int64
    # tensor beside a row whose top_k truncates, 10**30 overflowed, failing every request in the step.
    metadata = meta([SamplingParams(top_k=3), SamplingParams(top_k=10**30), SamplingParams(top_k=2**63)])
    out = apply_top_k_top_p(torch.arange(24.0).reshape(3, 8), metadata.top_k, None)
    assert kept(out[0]) == {5, 6, 7} and kept(out[1]) == kept(out[2]) == set(range(8))


def _smallest_nucleus(logits_row, p):
    probs = logits_row.double().softmax(-1)
    order = probs.argsort(descending=True)
    total = 0.0
    for count, token in enumerate(order.tolist(), start=1):
        total += probs[token].item()
        if total >= p:
            return set(order[:count].tolist())
    return set(order.tolist())


@pytest.mark.parametrize("p", [0.05, 0.3, 0.5, 0.77, 0.9, 0.999, 1.0])
def test_top_p_keeps_the_smallest_set_with_mass_at_least_p(p):
    torch.manual_seed(1)
    logits = torch.randn(6, 40) * 2
    out = apply_top_k_top_p(logits.clone(), None, torch.full((6,), p))
    for row in range(6):
        assert kept(out[row]) == _smallest_nucleus(logits[row], p)


def test_top_p_applies_to_the_top_k_renormalized_distribution():
    torch.manual_seed(2)
    logits = torch.randn(4, 30)
    out = apply_top_k_top_p(logits.clone(), torch.tensor([5, 5, 12, 0]), torch.tensor([0.6, 1.0, 0.8, 0.5]))
    for row, (k, p) in enumerate([(5, 0.6), (5, 1.0), (12, 0.8), (30, 0.5)]):
        only_k = torch.full_like(logits[row], -INF)
        idx = logits[row].topk(k).indices
        only_k[idx] = logits[row][idx]
        assert kept(out[row]) == _smallest_nucleus(only_k, p)


def test_min_p_threshold_is_relative_to_the_max_probability():
    torch.manual_seed(3)
    logits = torch.randn(3, 25) * 2
    min_p = torch.tensor([0.0, 0.1, 0.5])
    out = apply_min_p(logits.clone(), min_p)
    probs = logits.softmax(-1)
    for row in range(3):
        expected = set(torch.nonzero(probs[row] >= min_p[row] * probs[row].max()).flatten().tolist())
        assert kept(out[row]) == expected


# ---- request-level processors and penalties ---------------------------------------------------------

def test_penalties_against_hand_computed_values():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0, 1.0]])
    params = [SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)]
    out = apply_penalties(logits.clone(), meta(params, outputs=[[3, 3, 4]], prompts=[[0, 1]], vocab=6))
    # repetition: tokens 0, 1 (prompt) and 3, 4 (output); positive / 2, negative * 2
    # frequency 0.5 * count and presence 0.25 on output tokens 3 (x2) and 4 (x1)
    expected = torch.tensor([[1.0, -2.0, 0.5, 1.5 - 1.0 - 0.25, -4.0 - 0.5 - 0.25, 1.0]])
    torch.testing.assert_close(out, expected)


def test_penalties_per_row_and_noop_when_unset():
    logits = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    params = [SamplingParams(presence_penalty=1.0), SamplingParams()]
    out = apply_penalties(logits.clone(), meta(params, outputs=[[0], [0, 1]], vocab=3))
    assert out.tolist() == [[0.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
    none = meta([SamplingParams()], vocab=3)
    assert none.no_penalties and none.prompt_token_ids is None


def test_repetition_penalty_needs_prompt_ids():
    with pytest.raises(ValueError, match="prompt_token_ids"):
        meta([SamplingParams(repetition_penalty=1.2)])


def test_logit_bias_and_allowed_tokens():
    logits = torch.zeros(2, 6)
    params = [SamplingParams(logit_bias={1: 2.5, 4: -1.0}), SamplingParams(allowed_token_ids=[2, 5])]
    m = meta(params, vocab=6)
    out = apply_logit_bias(apply_allowed_token_ids(logits.clone(), m), m)
    assert out[0].tolist() == [0.0, 2.5, 0.0, 0.0, -1.0, 0.0]
    assert kept(out[1]) == {2, 5}


def test_min_tokens_suppresses_eos_and_stop_tokens_until_reached():
    params = [SamplingParams(min_tokens=3, stop_token_ids=[5]),
              SamplingParams(min_tokens=2, stop_token_ids=[5]),
              SamplingParams(min_tokens=3, ignore_eos=True, stop_token_ids=[6])]
    m = meta(params, outputs=[[1, 1], [1, 1], []], eos=2)
    out = apply_min_tokens(torch.zeros(3, 8), m)
    assert kept(out[0]) == set(range(8)) - {2, 5}  # 2 outputs < 3: eos and stop token banned
    assert kept(out[1]) == set(range(8))  # min_tokens reached
    assert kept(out[2]) == set(range(8)) - {6}  # ignore_eos: only the stop token


def test_bad_words_single_and_multi_token():
    params = [SamplingParams()] * 3
    words = [[[4], [1, 2, 3]], [[1, 2, 3]], [[7, 3]]]
    m = meta(params, outputs=[[0, 1, 2], [1, 0, 2], []], bad_words=words)
    out = apply_bad_words(torch.zeros(3, 8), m)
    assert kept(out[0]) == set(range(8)) - {4, 3}  # single token always; 1 2 -> 3 matches
    assert kept(out[1]) == set(range(8))  # output ends "0 2", not "1 2"
    assert kept(out[2]) == set(range(8))  # too short for the prefix


def test_out_of_vocab_ids_are_rejected():
    with pytest.raises(ValueError, match="logit_bias.*99"):
        meta([SamplingParams(logit_bias={99: 1.0})])
    with pytest.raises(ValueError, match="allowed_token_ids"):
        meta([SamplingParams(allowed_token_ids=[8])])


# ---- end to end -------------------------------------------------------------------------------------

def test_greedy_fast_path_is_argmax_and_leaves_logits_alone():
    torch.manual_seed(4)
    logits = torch.randn(7, 100)
    before = logits.clone()
    out = Sampler()(logits, meta([SamplingParams(temperature=0.0)] * 7, vocab=100))
    assert torch.equal(out.sampled_token_ids, before.argmax(-1)) and out.logprobs is None
    assert torch.equal(logits, before)


def test_greedy_rows_in_a_mixed_batch_take_argmax():
    torch.manual_seed(5)
    logits = torch.randn(6, 50)
    params = [SamplingParams(temperature=0.0, logit_bias={7: 100.0}) if i % 2 else SamplingParams(temperature=1.5)
              for i in range(6)]
    out = Sampler()(logits, meta(params, vocab=50)).sampled_token_ids
    assert out[1::2].tolist() == [7, 7, 7]


def test_bfloat16_logits_are_sampled_in_float32():
    logits = torch.randn(3, 40).to(torch.bfloat16)
    out = Sampler()(logits, meta([SamplingParams(temperature=0.0, logprobs=2)] * 3, vocab=40))
    assert out.logprobs.logprobs.dtype == torch.float32
    assert torch.equal(out.sampled_token_ids, logits.float().argmax(-1))


def _run_seeded(rows, steps, logits_for):
    """Sample `steps` tokens per row; rows are (params, key). Returns {key: tokens} for seeded rows."""
    generators = {i: make_generator(p.seed) for i, (p, _) in enumerate(rows) if p.seed is not None}
    tokens = {key: [] for _, key in rows}
    sampler = Sampler()
    for step in range(steps):
        logits = torch.stack([logits_for(key, step) for _, key in rows])
        m = SamplingMetadata.from_requests([p for p, _ in rows], [tokens[k] for _, k in rows], None, generators,
                                           vocab_size=logits.shape[1])
        for (_, key), token in zip(rows, sampler(logits, m).sampled_token_ids.tolist()):
            tokens[key].append(token)
    return {key: tokens[key] for p, key in rows if p.seed is not None}


def test_seeded_sampling_is_reproducible_across_batch_compositions():
    def logits_for(key, step):
        # The logits depend only on (request, step), never on the batch around the request.
        return torch.randn(64, generator=torch.Generator().manual_seed(1000 * step + ord(key)))

    seeded = SamplingParams(temperature=1.0, top_p=0.9, seed=1234)
    alone = _run_seeded([(seeded, "a")], 12, logits_for)["a"]
    crowded = _run_seeded([(SamplingParams(temperature=0.8), "x"), (SamplingParams(seed=7), "y"), (seeded, "a"),
                           (SamplingParams(temperature=0.0), "z")], 12, logits_for)["a"]
    reordered = _run_seeded([(seeded, "a"), (SamplingParams(top_k=3, seed=9), "w")], 12, logits_for)["a"]
    assert alone == crowded == reordered
    other_seed = _run_seeded([(SamplingParams(temperature=1.0, top_p=0.9, seed=4321), "a")], 12, logits_for)["a"]
    assert other_seed != alone


def test_seeded_row_without_generator_is_an_error():
    with pytest.raises(ValueError, match="seed=3 but no generator"):
        meta([SamplingParams(seed=3)])
    meta([SamplingParams(seed=3, temperature=0.0)])  # greedy needs no generator


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.5),
    SamplingParams(temperature=1.3, top_k=4),
    SamplingParams(temperature=1.0, top_p=0.8),
    SamplingParams(temperature=0.9, top_k=5, top_p=0.9, min_p=0.05),
])
def test_sampling_follows_the_filtered_distribution(params):
    torch.manual_seed(11)
    vocab, num_rows = 8, 20000
    base = torch.tensor([1.5, 1.0, 0.7, 0.2, 0.0, -0.5, -1.0, -3.0])
    out = Sampler()(base.repeat(num_rows, 1), meta([params] * num_rows, vocab=vocab)).sampled_token_ids
    counts = torch.bincount(out, minlength=vocab)

    # The expected distribution, computed directly in float64 from the definitions.
    probs = (base.double() / params.temperature).softmax(-1)
    keep = torch.ones(vocab, dtype=torch.bool)
    if params.min_p:
        keep &= probs >= params.min_p * probs.max()
    if params.top_k:
        keep &= torch.zeros(vocab, dtype=torch.bool).index_fill(0, probs.topk(params.top_k).indices, True)
    if params.top_p < 1.0:
        renorm = torch.where(keep, probs, 0) / torch.where(keep, probs, 0).sum()
        keep &= torch.zeros(vocab, dtype=torch.bool).index_fill(
            0, torch.tensor(sorted(_smallest_nucleus(renorm.log(), params.top_p))), True)
    expected = torch.where(keep, probs, 0)
    expected /= expected.sum()

    assert counts[~keep].sum() == 0
    result = stats.chisquare(counts[keep].numpy(), (expected[keep] * num_rows).numpy())
    assert result.pvalue > 1e-3, (counts.tolist(), (expected * num_rows).tolist())


def test_logprobs_are_raw_with_top_k_and_rank():
    torch.manual_seed(6)
    logits = torch.randn(3, 30)
    params = [SamplingParams(temperature=0.0, logprobs=3, logit_bias={29: 50.0}),
              SamplingParams(temperature=1.0, logprobs=0),
              SamplingParams(temperature=0.0)]
    generators = {}
    out = Sampler()(logits, SamplingMetadata.from_requests(params, [[], [], []], vocab_size=30,
                                                            generators=generators))
    raw = logits.log_softmax(-1)
    tensors = out.logprobs
    assert tensors.logprob_token_ids.shape == (3, 4) and tensors.logprobs.shape == (3, 4)
    # Row 0: the bias forced token 29, but logprobs and rank describe the raw model distribution.
    assert out.sampled_token_ids[0] == 29
    assert tensors.logprob_token_ids[0, 0] == 29
    torch.testing.assert_close(tensors.logprobs[0, 0], raw[0, 29])
    top = raw[0].topk(3)
    assert tensors.logprob_token_ids[0, 1:].tolist() == top.indices.tolist()
    torch.testing.assert_close(tensors.logprobs[0, 1:], top.values)
    assert tensors.selected_token_ranks[0] == int((raw[0] > raw[0, 29]).sum()) + 1
    # Row 2 is greedy over unchanged logits: rank 1, and its top-1 is itself.
    assert tensors.selected_token_ranks[2] == 1 and tensors.logprob_token_ids[2, 1] == out.sampled_token_ids[2]
    sampled = out.sampled_token_ids[1]
    torch.testing.assert_close(tensors.logprobs[1, 0], raw[1, sampled])
    assert math.isclose(tensors.logprobs[0].exp()[1:].sum().item(), top.values.exp().sum().item(), rel_tol=1e-6)


def test_min_tokens_accepts_several_eos_ids():
    m = meta([SamplingParams(min_tokens=1)], eos=[2, 6])
    assert kept(apply_min_tokens(torch.zeros(1, 8), m)[0]) == set(range(8)) - {2, 6}
