"""The output processor on synthetic core outputs: output kinds, stop strings across steps, finish
reasons reported by the core, and outputs for requests it no longer tracks."""

import pytest

from engine.core import EngineCoreOutput, SamplingParams
from engine.models import load_tokenizer
from engine.output_processor import OutputProcessor
from engine.runner.logprobs_lists import TokenLogprobs


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_path):
    return load_tokenizer(tiny_llama_path)


def pieces(tokenizer, text):
    return [[t] for t in tokenizer.encode(text, add_special_tokens=False)]


def test_output_kinds(tokenizer):
    processor = OutputProcessor(tokenizer)
    params = SamplingParams(max_tokens=50)
    for kind in ("final", "cumulative", "delta"):
        processor.add_request(kind, "p", [1, 40], params, output_kind=kind)
    steps = pieces(tokenizer, "ab 😀 cd")
    seen = {kind: [] for kind in ("final", "cumulative", "delta")}
    for index, token_ids in enumerate(steps):
        finish = "length" if index == len(steps) - 1 else None
        outputs = [EngineCoreOutput(kind, token_ids, finish) for kind in seen]
        for request_output in processor.process_outputs(outputs).request_outputs:
            seen[request_output.request_id].append(request_output)
    assert len(seen["final"]) == 1 and seen["final"][0].outputs[0].text == "ab 😀 cd"
    assert len(seen["cumulative"]) == len(steps) and seen["cumulative"][-1].outputs[0].text == "ab 😀 cd"
    assert "".join(o.outputs[0].text for o in seen["delta"]) == "ab 😀 cd"
    assert sum(len(o.outputs[0].token_ids) for o in seen["delta"]) == len(steps)
    assert [o.finished for o in seen["delta"]][-2:] == [False, True]
    assert not processor.has_unfinished_requests()


def test_stop_string_across_steps_and_later_outputs_ignored(tokenizer):
    processor = OutputProcessor(tokenizer)
    processor.add_request("r", None, [1], SamplingParams(stop=["END"], max_tokens=50))
    aborted = []
    for token_ids in pieces(tokenizer, "one EN") + pieces(tokenizer, "D two"):
        result = processor.process_outputs([EngineCoreOutput("r", token_ids)])
        aborted += result.reqs_to_abort
        if result.request_outputs:
            (final,) = result.request_outputs
            break
    assert aborted == ["r"]
    assert (final.outputs[0].text, final.outputs[0].finish_reason, final.outputs[0].stop_reason) == (
        "one ", "stop", "END")
    # The core's confirmation of the abort (and anything else for that id) is ignored.
    assert processor.process_outputs([EngineCoreOutput("r", [], "stop")]).request_outputs == []


@pytest.mark.parametrize("min_tokens, text", [
    (0, "x"),             # no minimum: the first token's own "x" ends the request
    (1, "x yx"),          # the first token is exempt, the next "x" ends it
    (2, "x yx"),          # so is the second ("x y"), and the third token's "x" ends it
    (3, "x yx zx"),       # all three are exempt: the fourth token's "x" ends it
])
def test_no_stop_string_is_looked_for_in_the_text_of_the_first_min_tokens(tokenizer, min_tokens, text):
    """As in vLLM, the search starts after the text of the first min_tokens tokens: a stop string in the
    min_tokens-th token's own text used to end the request there (min_tokens=1 did nothing)."""
    steps = [tokenizer.encode(piece, add_special_tokens=False) for piece in ("x", " y", "x", " z", "x", " w")]
    assert all(len(step) == 1 for step in steps), steps  # one token per piece, so each step is one token
    processor = OutputProcessor(tokenizer)
    processor.add_request("r", None, [1], SamplingParams(stop=["x"], include_stop_str_in_output=True,
                                                         min_tokens=min_tokens, max_tokens=50))
    for token_ids in steps:
        result = processor.process_outputs([EngineCoreOutput("r", token_ids)])
        if result.request_outputs:
            (final,) = result.request_outputs
            break
    assert (final.outputs[0].text, final.outputs[0].finish_reason) == (text, "stop")


def test_core_finish_reasons_and_messages(tokenizer):
    processor = OutputProcessor(tokenizer)
    processor.add_request("ignored", None, [1], SamplingParams())
    processor.add_request("aborted", None, [1], SamplingParams(logprobs=1))
    outputs = processor.process_outputs([
        EngineCoreOutput("ignored", [], "ignored", status_message="the prompt is empty"),
        EngineCoreOutput("aborted", [50], None, logprobs=TokenLogprobs([50, 60], [-1.5, -0.5], 2)),
    ]).request_outputs
    assert [(o.outputs[0].finish_reason, o.status_message) for o in outputs] == [("ignored", "the prompt is empty")]
    (aborted,) = processor.process_outputs([EngineCoreOutput("aborted", [], "abort")]).request_outputs
    completion = aborted.outputs[0]
    assert completion.finish_reason == "abort" and completion.token_ids == [50]
    assert completion.cumulative_logprob == -1.5
    assert {t: (lp.logprob, lp.rank) for t, lp in completion.logprobs[0].items()} == {50: (-1.5, 2), 60: (-0.5, 1)}


@pytest.mark.parametrize("core_finish", [None, "length"])
def test_a_stop_string_inside_a_step_of_several_tokens_drops_the_tokens_after_it(tokenizer, core_finish):
    """Speculative decoding brings several tokens in one step: the output ends at the token that completed the
    stop string, as steps of one token would end it, and the core is asked to finish it unless it did."""
    tokens = [t for (t,) in pieces(tokenizer, "one END two three")]
    one_per_step = OutputProcessor(tokenizer)
    one_per_step.add_request("r", None, [1], SamplingParams(stop=["END"], max_tokens=50))
    for token in tokens:
        result = one_per_step.process_outputs([EngineCoreOutput("r", [token])])
        if result.request_outputs:
            expected = result.request_outputs[0].outputs[0]
            break
    processor = OutputProcessor(tokenizer)
    processor.add_request("r", None, [1], SamplingParams(stop=["END"], max_tokens=50))
    result = processor.process_outputs([EngineCoreOutput("r", tokens, core_finish)])
    (final,) = result.request_outputs
    assert result.reqs_to_abort == ([] if core_finish else ["r"])
    assert final.outputs[0].token_ids == expected.token_ids and len(expected.token_ids) < len(tokens)
    assert (final.outputs[0].text, final.outputs[0].finish_reason, final.outputs[0].stop_reason) == (
        "one ", "stop", "END")
