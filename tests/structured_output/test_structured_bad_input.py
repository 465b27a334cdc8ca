"""A structured-output request the engine cannot honour is a ValueError naming the field and its value, raised
when the request is added: nothing reaches the scheduler, no block is held, and the next request is served."""

import pytest

from engine import LLM, SamplingParams, StructuredOutputsParams
from tests.structured_output.helpers import assert_healthy


@pytest.fixture(scope="module")
def llm(tiny_model_path):
    return LLM(model=str(tiny_model_path), max_num_seqs=4, max_model_len=128)


@pytest.mark.parametrize("structured,message", [
    (StructuredOutputsParams(json={"type": "foo"}),
     r"prompt 1: SamplingParams\.structured_outputs\.json is not a valid JSON schema \(Unsupported type \"foo\"\), "
     r"got \{'type': 'foo'\}"),
    (StructuredOutputsParams(json={"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}),
     r"structured_outputs\.json is not a valid JSON schema .*nowhere"),
    (StructuredOutputsParams(regex="[0-9"), r"structured_outputs\.regex is not a valid regular expression "
                                            r"\(Regex parsing error at position \d+: Unclosed '\['\), got '\[0-9'"),
    (StructuredOutputsParams(grammar='item ::= "a"'), r"structured_outputs\.grammar is not a valid EBNF grammar "
                                                       r"\(.*The root rule with name \"root\" is not found\)"),
    (StructuredOutputsParams(grammar='root ::= "a" | '), r"structured_outputs\.grammar .*Expect element"),
    (StructuredOutputsParams(regex="(" * 200), r"got '\({76}\.\.\.$"),  # a long value is shortened
])
def test_grammars_that_do_not_compile(llm, structured, message):
    params = [SamplingParams(max_tokens=2), SamplingParams(max_tokens=2, structured_outputs=structured)]
    with pytest.raises(ValueError, match=message):
        llm.generate(["fine", "bad"], params, use_tqdm=False)
    assert_healthy(llm)


@pytest.mark.parametrize("fields,message", [
    (dict(json={"type": "object"}, regex="a+"), r"needs exactly one of json, regex, choice, grammar, json_object; "
                                                 r"got json, regex"),
    (dict(choice=["a"], json_object=True), r"got choice, json_object"),
    (dict(), r"got none"),
    (dict(json_object=False), r"got none"),
    (dict(json="{not json"), r"StructuredOutputsParams\.json must be a JSON schema; the string is not JSON"),
    (dict(json="[1, 2]"), r"StructuredOutputsParams\.json must be a JSON schema: a dict"),
    (dict(json={"bad": {1, 2}}), r"StructuredOutputsParams\.json must be a JSON schema of JSON values"),
    (dict(regex=""), r"StructuredOutputsParams\.regex must be a non-empty string, got ''"),
    (dict(choice=[]), r"StructuredOutputsParams\.choice must be a non-empty list of non-empty strings, got \[\]"),
    (dict(choice=["a", 3]), r"StructuredOutputsParams\.choice must be .*got \['a', 3\]"),
    (dict(choice="yes"), r"StructuredOutputsParams\.choice must be"),
    (dict(grammar="  "), r"StructuredOutputsParams\.grammar must be a non-empty string"),
    (dict(json_object="yes"), r"StructuredOutputsParams\.json_object must be a boolean"),
    (dict(regex="a", disable_any_whitespace=1), r"StructuredOutputsParams\.disable_any_whitespace must be a boolean"),
])
def test_bad_parameters_are_refused_at_construction(fields, message):
    with pytest.raises(ValueError, match=message):
        StructuredOutputsParams(**fields)


def test_sampling_params_takes_only_the_params_object():
    with pytest.raises(ValueError, match=r"SamplingParams\.structured_outputs must be None or a "
                                         r"StructuredOutputsParams, got \{'choice': \['a'\]\}"):
        SamplingParams(structured_outputs={"choice": ["a"]})


def test_token_id_engines_refuse_structured_outputs(tiny_model_path):
    llm = LLM(model=str(tiny_model_path), max_num_seqs=2, max_model_len=128, skip_tokenizer_init=True)
    params = SamplingParams(max_tokens=2, structured_outputs=StructuredOutputsParams(regex="a"))
    with pytest.raises(ValueError, match=r"structured_outputs needs a tokenizer .*skip_tokenizer_init=True"):
        llm.generate([[5, 6]], params, use_tqdm=False)
    assert_healthy(llm, prompt=[5, 6])
