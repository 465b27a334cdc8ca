"""``LLM.beam_search`` equals a beam search written here on transformers' logits (fp32, CPU).

The reference runs the same algorithm (vLLM's) independently: a full forward pass per beam per round,
log-softmax of the last position, the top ``2 * beam_width`` tokens. Token sequences must be equal and
cumulative logprobs within 1e-4, for widths 1 (greedy decoding's tokens), 2 and 4 on two prompts, with
EOS ignored and with an EOS that wins: the engine is built from a copy of the tiny checkpoint whose
config.json names as EOS a token the search meets among its top candidates.
"""

import json
import shutil

import pytest
import torch

from engine import LLM
from engine.beam_search import BeamSearchParams
from tests.engine.model_fixtures import hf_greedy, hf_logits, load_hf_model

PROMPTS = [[5, 17, 99, 230, 41, 7], [300, 12, 12, 64, 180, 9, 77, 3, 150]]
MAX_TOKENS = 6


def reference_beam_search(hf_model, prompt, beam_width, max_tokens, eos_ids, length_penalty=1.0):
    """[(generated token ids, cum logprob)], best first."""
    def score(entry):  # vLLM's get_beam_search_score: the length counts the prompt, not a final EOS
        tokens, cum = entry
        length = len(prompt) + len(tokens) - (1 if tokens and tokens[-1] in eos_ids else 0)
        return cum / length ** length_penalty

    beams, completed = [([], 0.0)], []
    for _ in range(max_tokens):
        if not beams:
            break
        candidates = []
        for tokens, cum in beams:
            logprobs = hf_logits(hf_model, prompt + tokens)[-1].float().log_softmax(-1)
            top = torch.topk(logprobs, 2 * beam_width)
            for logprob, token in zip(top.values.tolist(), top.indices.tolist()):
                (completed if token in eos_ids else candidates).append((tokens + [token], cum + logprob))
        candidates.sort(key=score, reverse=True)
        beams = candidates[:beam_width]
    return sorted(completed + beams, key=score, reverse=True)[:beam_width]


@pytest.fixture(scope="module")
def hf_model(tiny_llama_path):
    return load_hf_model(tiny_llama_path)


@pytest.fixture(scope="module")
def eos_setup(hf_model, tiny_llama_path, tmp_path_factory):
    """(engine on a checkpoint copy whose EOS is greedy's third token for prompt 0, that EOS id)."""
    eos = hf_greedy(hf_model, PROMPTS[0], 3)[2]
    path = tmp_path_factory.mktemp("tiny-eos") / "model"
    shutil.copytree(tiny_llama_path, path)
    config = json.loads((path / "config.json").read_text())
    config["eos_token_id"] = eos
    (path / "config.json").write_text(json.dumps(config))
    return LLM(model=str(path)), eos


@pytest.fixture(scope="module")
def llm(tiny_llama_path):
    return LLM(model=str(tiny_llama_path))


def check_equal(outputs, hf_model, params, eos_ids):
    for prompt, output in zip(PROMPTS, outputs):
        want = reference_beam_search(hf_model, prompt, params.beam_width, params.max_tokens, eos_ids,
                                     params.length_penalty)
        got = [(sequence.tokens[len(prompt):], sequence.cum_logprob) for sequence in output.sequences]
        assert [tokens for tokens, _ in got] == [tokens for tokens, _ in want]
        for (_, got_cum), (_, want_cum) in zip(got, want):
            assert got_cum == pytest.approx(want_cum, abs=1e-4)
        for sequence in output.sequences:
            assert sequence.tokens[:len(prompt)] == prompt
            assert len(sequence.logprobs) == len(sequence.tokens) - len(prompt)


@pytest.mark.parametrize("beam_width", [1, 2, 4])
def test_beam_search_matches_transformers_ignoring_eos(llm, hf_model, beam_width):
    params = BeamSearchParams(beam_width=beam_width, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = llm.beam_search(PROMPTS, params)
    check_equal(outputs, hf_model, params, eos_ids=[])
    for output in outputs:
        assert len(output.sequences) == beam_width
        assert all(sequence.finish_reason == "length" for sequence in output.sequences)
    if beam_width == 1:
        assert [output.sequences[0].tokens[len(prompt):] for prompt, output in zip(PROMPTS, outputs)] == \
            [hf_greedy(hf_model, prompt, MAX_TOKENS) for prompt in PROMPTS]
    manager = llm.scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks


@pytest.mark.parametrize("beam_width", [1, 2, 4])
def test_beam_search_matches_transformers_with_eos(eos_setup, hf_model, beam_width):
    llm, eos = eos_setup
    params = BeamSearchParams(beam_width=beam_width, max_tokens=MAX_TOKENS)
    outputs = llm.beam_search(PROMPTS, params)
    check_equal(outputs, hf_model, params, eos_ids=[eos])
    stopped = [sequence for output in outputs for sequence in output.sequences if sequence.finish_reason == "stop"]
    assert stopped, "the EOS never won: the test would not cover early finishing"
    for sequence in stopped:
        assert sequence.tokens[-1] == eos
        assert sequence.text == llm.tokenizer.decode(sequence.tokens[len(sequence.tokens) - len(sequence.logprobs):-1],
                                                     skip_special_tokens=False)


@pytest.mark.parametrize("length_penalty", [0.0, 2.0])
def test_length_penalty_ranks_as_the_reference(eos_setup, hf_model, length_penalty):
    llm, eos = eos_setup
    params = BeamSearchParams(beam_width=4, max_tokens=MAX_TOKENS, length_penalty=length_penalty)
    check_equal(llm.beam_search(PROMPTS, params), hf_model, params, eos_ids=[eos])


def test_include_stop_str_in_output_keeps_the_eos_text(eos_setup):
    llm, eos = eos_setup
    params = BeamSearchParams(beam_width=2, max_tokens=MAX_TOKENS, include_stop_str_in_output=True)
    stopped = [s for output in llm.beam_search(PROMPTS, params) for s in output.sequences if s.finish_reason == "stop"]
    assert stopped
    for sequence in stopped:
        assert sequence.text == llm.tokenizer.decode(sequence.output_token_ids, skip_special_tokens=False)


def test_too_long_for_the_context_is_refused_before_any_request(llm):  # max_model_len 2048
    with pytest.raises(ValueError, match=r"prompt 0 has 6 tokens; with max_tokens=2043"):
        llm.beam_search(PROMPTS, BeamSearchParams(beam_width=2, max_tokens=2043))
    assert not llm.engine_core.has_work()


@pytest.mark.parametrize("field, value", [("beam_width", 0), ("max_tokens", 0), ("ignore_eos", 1),
                                          ("temperature", -1.0), ("length_penalty", float("nan")),
                                          ("include_stop_str_in_output", "yes")])
def test_bad_params_name_the_field(field, value):
    kwargs = dict(beam_width=2, max_tokens=4)
    kwargs[field] = value
    with pytest.raises(ValueError, match=f"BeamSearchParams.{field} must be"):
        BeamSearchParams(**kwargs)
