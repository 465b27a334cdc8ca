"""Structured outputs under the scheduler's other moves: prompts prefilled in chunks (no token sampled, so no
grammar step, until the last chunk), preemption with recomputation (the runner keeps the matcher and the
request resumes with the output the scheduler kept), and the matcher's rollback when the scheduler's copy of
the output is shorter than what was sampled."""

import json
import re

import pytest
import torch

from engine import LLM, SamplingParams, StructuredOutputsParams
from engine.runner.structured_output import RequestGrammar
from tests.structured_output.helpers import SCHEMA, assert_healthy, satisfies_schema

LONG_NUMBER = r"([0-9]{3}-){6}[0-9]{4}"  # about 30 tokens of output, forced to end


def test_chunked_prefill_and_preemption_give_valid_outputs(small_model_path, monkeypatch):
    # 11 usable blocks of 16 tokens for four requests of ~37 prompt tokens and up to 48 output tokens: they cannot
    # all stay, and fcfs preempts the latest, constrained ones mid-output. 32 tokens per step chunk the prompts.
    llm = LLM(model=str(small_model_path), max_num_seqs=4, max_model_len=256, num_gpu_blocks=12,
              max_num_batched_tokens=32, enable_prefix_caching=False)
    prompt = " ".join(["the scheduler preempts a request when the cache is full"] * 3)
    assert len(llm.get_tokenizer()(prompt).input_ids) > 32
    params = [SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=48, structured_outputs=StructuredOutputsParams(
                  regex=LONG_NUMBER)),
              SamplingParams(temperature=1.0, seed=3, max_tokens=48, structured_outputs=StructuredOutputsParams(
                  json=SCHEMA, disable_any_whitespace=True)),
              SamplingParams(temperature=1.0, seed=5, max_tokens=48, structured_outputs=StructuredOutputsParams(
                  regex=LONG_NUMBER))]
    resumed = []  # output lengths of constrained requests the runner re-synced on resuming after a preemption
    sync = RequestGrammar.sync
    monkeypatch.setattr(RequestGrammar, "sync",
                        lambda grammar, tokens: resumed.append(len(tokens)) or sync(grammar, tokens))
    prompts = [prompt + f" {index}" for index in range(4)]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert llm.scheduler.num_preemptions_total > 0 and any(resumed), resumed
    assert len(outputs[0].outputs[0].token_ids) == 48
    for index in (1, 3):
        assert re.fullmatch(LONG_NUMBER, outputs[index].outputs[0].text), outputs[index].outputs[0]
    assert satisfies_schema(json.loads(outputs[2].outputs[0].text))
    # The constrained requests' tokens are those of an engine that neither preempts nor chunks.
    roomy = LLM(model=str(small_model_path), max_num_seqs=4, max_model_len=256, num_gpu_blocks=64)
    alone = roomy.generate(prompts[1:], params[1:], use_tqdm=False)
    assert [o.outputs[0].token_ids for o in alone] == [o.outputs[0].token_ids for o in outputs[1:]]
    assert_healthy(llm)


@pytest.fixture(scope="module")
def grammars(small_model_path):
    """The engine's grammars over the small model's vocabulary, without an engine around them."""
    from engine.models import load_tokenizer
    from engine.runner.structured_output import StructuredOutputs

    tokenizer = load_tokenizer(small_model_path)
    return StructuredOutputs(tokenizer, 8192, [tokenizer.eos_token_id]), tokenizer


def bitmask_after(grammars, grammar, row: int = 0) -> torch.Tensor:
    bitmask = grammars.backend.allocate_bitmask(1)
    grammar.fill_bitmask(bitmask, row)
    return bitmask


def test_sync_rolls_back_to_the_schedulers_tokens(grammars):
    """After a truncation (the scheduler kept fewer tokens) or a resume with different tokens, the matcher is in
    the state a fresh matcher reaches on the scheduler's tokens alone."""
    structured, tokenizer = grammars
    params = StructuredOutputsParams(regex=LONG_NUMBER)
    sampled = tokenizer.encode("123-456-789", add_special_tokens=False)
    kept = sampled[:len(sampled) // 2]
    grammar = structured.new_request_grammar("r", params)
    for token_id in sampled:
        grammar.accept(token_id)
    assert grammar.token_ids == sampled
    grammar.sync(kept)
    fresh = structured.new_request_grammar("fresh", params)
    fresh.sync(kept)
    assert grammar.token_ids == kept == fresh.token_ids
    assert torch.equal(bitmask_after(structured, grammar), bitmask_after(structured, fresh))
    # A different continuation replays from the common prefix.
    other = tokenizer.encode("123-999", add_special_tokens=False)
    grammar.sync(other)
    fresh = structured.new_request_grammar("fresh", params)
    fresh.sync(other)
    assert grammar.token_ids == other and torch.equal(bitmask_after(structured, grammar),
                                                      bitmask_after(structured, fresh))


def test_a_refused_token_abandons_the_grammar_until_it_is_rolled_back(grammars):
    structured, tokenizer = grammars
    grammar = structured.new_request_grammar("r", StructuredOutputsParams(regex="[0-9]{3}"))
    digits = tokenizer.encode("12", add_special_tokens=False)
    letter = tokenizer.encode("x", add_special_tokens=False)
    for token_id in digits + letter:
        grammar.accept(token_id)
    assert grammar.abandoned and not grammar.constrains and grammar.token_ids == digits
    grammar.sync(digits)  # the scheduler dropped the refused token
    assert grammar.constrains and grammar.token_ids == digits


def test_a_terminated_grammar_stops_constraining(grammars):
    structured, tokenizer = grammars
    grammar = structured.new_request_grammar("r", StructuredOutputsParams(choice=["yes"]))
    for token_id in tokenizer.encode("yes", add_special_tokens=False) + [tokenizer.eos_token_id]:
        assert grammar.constrains
        grammar.accept(token_id)
    assert not grammar.constrains and not grammar.abandoned
    grammar.accept(5)  # with ignore_eos the request goes on; nothing is tracked past the grammar's end
    assert grammar.token_ids[-1] == tokenizer.eos_token_id
