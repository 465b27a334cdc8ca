"""Structured outputs through ``LLM.generate`` on the generated small model: its random weights write
gibberish, so every well-formed answer here is the grammar's doing (test_the_constraint_is_what_did_it
checks that the same prompts unconstrained give something else)."""

import json
import math
import re

import pytest

from engine import LLM, SamplingParams, StructuredOutputsParams
from tests.structured_output.helpers import SCHEMA, assert_healthy, satisfies_schema

PROMPTS = ["The answer is", "Pick a color:", "Hello world"]
CHOICES = ["yes", "no", "maybe so"]
PHONE = r"[0-9]{3}-[0-9]{4}"


@pytest.fixture(scope="module")
def llm(small_model_path):
    return LLM(model=str(small_model_path), max_num_seqs=8, max_model_len=256, num_gpu_blocks=64)


def constrained(structured: StructuredOutputsParams, max_tokens: int = 16, **kwargs) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, structured_outputs=structured, **kwargs)


def texts(outputs) -> list[str]:
    return [output.outputs[0].text for output in outputs]


def test_choice_greedy_and_seeded(llm):
    greedy = llm.generate(PROMPTS, constrained(StructuredOutputsParams(choice=CHOICES), max_tokens=8),
                          use_tqdm=False)
    seeded = llm.generate(PROMPTS * 2, [SamplingParams(temperature=1.0, seed=seed, max_tokens=8,
                                                       structured_outputs=StructuredOutputsParams(choice=CHOICES))
                                        for seed in range(6)], use_tqdm=False)
    for output in greedy + seeded:
        assert output.outputs[0].text in CHOICES and output.outputs[0].finish_reason == "stop", output.outputs[0]
    assert len(set(texts(seeded))) > 1  # sampling still samples: among the choices


def test_regex_matches_in_full(llm):
    outputs = llm.generate(PROMPTS, constrained(StructuredOutputsParams(regex=PHONE)), use_tqdm=False)
    for output in outputs:
        assert re.fullmatch(PHONE, output.outputs[0].text) and output.outputs[0].finish_reason == "stop"


def test_json_schema(llm):
    # Compact JSON: with optional whitespace allowed, a random model pads with tabs and newlines until
    # max_tokens; the grammar allows that, so the test asks for none.
    params = constrained(StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True), max_tokens=40)
    schema_as_text = constrained(StructuredOutputsParams(json=json.dumps(SCHEMA), disable_any_whitespace=True),
                                 max_tokens=40)
    outputs = llm.generate(PROMPTS + PROMPTS[:1], [params] * 3 + [schema_as_text], use_tqdm=False)
    for output in outputs:
        completion = output.outputs[0]
        assert satisfies_schema(json.loads(completion.text)) and completion.finish_reason == "stop", completion
    # The schema's property order is the output's: keys are not re-sorted on the way to the compiler.
    assert all(text.index('"ok"') < text.index('"color"') for text in texts(outputs))
    assert outputs[3].outputs[0].text == outputs[0].outputs[0].text  # a dict or its JSON text: one grammar


def test_json_object(llm):
    outputs = llm.generate(PROMPTS[:1], constrained(StructuredOutputsParams(json_object=True), max_tokens=16),
                           use_tqdm=False)
    assert isinstance(json.loads(outputs[0].outputs[0].text), dict)
    assert outputs[0].outputs[0].finish_reason == "stop"


def test_grammar(llm):
    grammar = 'root ::= "(" item ("," item)* ")"\nitem ::= [a-c] [0-9]'
    outputs = llm.generate(PROMPTS, constrained(StructuredOutputsParams(grammar=grammar), max_tokens=24),
                           use_tqdm=False)
    for output in outputs:
        text = output.outputs[0].text
        assert re.fullmatch(r"\([a-c][0-9](,[a-c][0-9])*\)", text) and output.outputs[0].finish_reason == "stop"


def test_the_constraint_is_what_did_it(llm):
    free = texts(llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False))
    assert not any(text in CHOICES or re.fullmatch(PHONE, text) for text in free), free
    for text in free:
        with pytest.raises(ValueError):
            json.loads(text)


def test_a_mixed_batch_leaves_unconstrained_rows_alone(llm):
    """The mask goes on the constrained rows only: the others' tokens (greedy and seeded) are those of a run
    with no structured request at all. The batch keeps its shape (the same prompts, one grammar swapped
    for none), so only the mask differs between the runs."""
    plain = [SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
             SamplingParams(temperature=1.0, seed=7, max_tokens=12, ignore_eos=True)]
    prompts = PROMPTS + ["A cache holds", "Requests arrive"]
    mixed = [constrained(StructuredOutputsParams(choice=CHOICES), max_tokens=12), plain[0],
             constrained(StructuredOutputsParams(regex=PHONE), max_tokens=12), plain[1], plain[0]]
    unconstrained = [plain[0], plain[0], plain[0], plain[1], plain[0]]
    with_grammars = llm.generate(prompts, mixed, use_tqdm=False)
    without = llm.generate(prompts, unconstrained, use_tqdm=False)
    for row in (1, 3, 4):
        assert with_grammars[row].outputs[0].token_ids == without[row].outputs[0].token_ids, row
    assert with_grammars[0].outputs[0].text in CHOICES and re.fullmatch(PHONE, with_grammars[2].outputs[0].text)


def test_unconstrained_steps_allocate_no_bitmask(llm, monkeypatch):
    backend = llm.model_runner.structured_outputs.backend
    calls = []
    allocate = backend.allocate_bitmask
    monkeypatch.setattr(backend, "allocate_bitmask", lambda rows: calls.append(rows) or allocate(rows))
    llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
    assert calls == []
    llm.generate(PROMPTS[:1], constrained(StructuredOutputsParams(choice=CHOICES)), use_tqdm=False)
    assert calls  # the same hook sees the constrained steps


def test_ignore_eos_goes_on_unconstrained_after_the_grammar(llm):
    """Documented behaviour: once the grammar is complete its mask allows only EOS; with ignore_eos that EOS
    does not end the request, and the tokens after it are unconstrained."""
    output = llm.generate(PROMPTS[:1], constrained(StructuredOutputsParams(choice=CHOICES), max_tokens=12,
                                                   ignore_eos=True), use_tqdm=False)[0].outputs[0]
    eos = llm.eos_token_ids[0]
    assert len(output.token_ids) == 12 and eos in output.token_ids
    grammar_part = output.token_ids[:output.token_ids.index(eos)]
    assert llm.get_tokenizer().decode(grammar_part) in CHOICES
    assert_healthy(llm)


def test_min_tokens_past_the_grammar_leaves_it_without_failing_the_step(llm, caplog):
    """Documented behaviour: a finished grammar allows only EOS, which min_tokens bans; the row has no token
    left, the sampler draws anyway, and the request continues unconstrained (logged), its neighbours unharmed."""
    params = [SamplingParams(temperature=temperature, seed=1, max_tokens=6, min_tokens=4,
                             structured_outputs=StructuredOutputsParams(choice=["yes"])) for temperature in (0.0, 1.0)]
    with caplog.at_level("WARNING", logger="engine.runner.structured_output.request_grammar"):
        outputs = llm.generate(PROMPTS[:2], params, use_tqdm=False)
    for output in outputs:
        assert output.outputs[0].text.startswith("yes") and len(output.outputs[0].token_ids) == 6
    assert "is outside its grammar" in caplog.text
    assert_healthy(llm)


def test_logprobs_see_the_mask(llm):
    """The mask goes on before the logprobs are read (vLLM's order): with two one-character choices the
    returned top-2 are those two tokens, and their probabilities sum to one."""
    params = constrained(StructuredOutputsParams(choice=["7", "8"]), max_tokens=4, logprobs=2)
    completion = llm.generate(PROMPTS[:1], params, use_tqdm=False)[0].outputs[0]
    assert completion.text in ("7", "8")
    tokenizer = llm.get_tokenizer()
    top = completion.logprobs[0]
    assert sorted(tokenizer.decode([token_id]) for token_id in top) == ["7", "8"]
    assert sum(math.exp(entry.logprob) for entry in top.values()) == pytest.approx(1.0, abs=1e-4)
