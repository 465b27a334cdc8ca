"""Structured outputs of a reasoning model (``reasoning_parser``, vLLM's structured outputs under a reasoning
parser): the grammar sleeps through the thought, every token allowed, and steers the answer from the token after
``</think>``; a prompt that closes the thought itself (Qwen3's template with enable_thinking off) is steered at once;
``structured_outputs_in_reasoning`` steers the whole output. The tiny model has random weights: a logit bias on
``</think>`` makes it end its thought at once, which only a sleeping grammar lets through."""

import shutil

import pytest

from engine import LLM, SamplingParams, StructuredOutputsParams

CHOICES = ["yes", "no"]


@pytest.fixture(scope="module")
def thinking_model(tiny_model_path, tmp_path_factory):
    """The tiny model with a tokenizer whose last two ids are <think> and </think> (added tokens that show in the
    text, as Qwen3's)."""
    from engine.models.synthetic_tokenizer import train_tokenizer

    path = tmp_path_factory.mktemp("thinking")
    for item in tiny_model_path.iterdir():
        if item.suffix in (".json", ".safetensors") and "token" not in item.name:
            shutil.copy(item, path / item.name)
    tokenizer = train_tokenizer(510, 256)
    tokenizer.add_tokens(["<think>", "</think>"])
    tokenizer.save_pretrained(str(path))
    return path


def params(**kwargs) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=8, structured_outputs=StructuredOutputsParams(choice=CHOICES),
                          **kwargs)


def test_the_grammar_steers_the_answer_after_the_thought(thinking_model):
    llm = LLM(model=str(thinking_model), reasoning_parser="deepseek_r1", max_model_len=256)
    end = llm.tokenizer.convert_tokens_to_ids("</think>")
    assert end == 511
    output = llm.generate(["The answer is"], params(logit_bias={end: 100.0}), use_tqdm=False)[0].outputs[0]
    assert output.token_ids[0] == end and output.text.removeprefix("</think>") in CHOICES
    assert output.finish_reason == "stop"
    # A prompt whose thought is closed already: steered from the first token, so the bias cannot end a thought.
    closed = llm.generate(["The answer is<think></think>"], params(logit_bias={end: 100.0}), use_tqdm=False)[0]
    assert closed.outputs[0].text in CHOICES


def test_structured_outputs_in_reasoning_steer_the_whole_output(thinking_model):
    llm = LLM(model=str(thinking_model), reasoning_parser="deepseek_r1", structured_outputs_in_reasoning=True,
              max_model_len=256)
    end = llm.tokenizer.convert_tokens_to_ids("</think>")
    assert llm.generate(["The answer is"], params(logit_bias={end: 100.0}), use_tqdm=False)[0].outputs[0].text \
        in CHOICES


def test_a_rolled_back_thought_waits_again(thinking_model):
    """The runner's grammar state follows the scheduler's output (sync): cut back inside the thought, it sleeps
    again; cut back after it, it keeps its start and replays the answer's tokens."""
    llm = LLM(model=str(thinking_model), reasoning_parser="deepseek_r1", max_model_len=256)
    structured = llm.model_runner.structured_outputs
    grammar = structured.new_request_grammar("r", StructuredOutputsParams(choice=CHOICES), [1, 5, 6])
    end = structured.reasoning_tags[1]
    yes = llm.tokenizer.encode("yes", add_special_tokens=False)
    for token in [7, 8, *end, *yes]:
        grammar.accept(token)
    assert grammar.start == 2 + len(end) and grammar.token_ids == yes
    grammar.sync([7, 8, *end])
    assert grammar.start == 2 + len(end) and grammar.token_ids == [] and grammar.constrains
    grammar.sync([7])
    assert grammar.start is None and not grammar.constrains
    grammar.sync([7, 9, *end, *yes])
    assert grammar.start == 2 + len(end) and grammar.token_ids == yes


HARMONY_MARKERS = ["<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>", "<|call|>", "<|return|>"]


@pytest.fixture(scope="module")
def harmony_model(tiny_model_path, tmp_path_factory):
    """The tiny model with a tokenizer whose last seven ids are gpt-oss's harmony markers, as special tokens."""
    from engine.models.synthetic_tokenizer import train_tokenizer

    path = tmp_path_factory.mktemp("harmony")
    for item in tiny_model_path.iterdir():
        if item.suffix in (".json", ".safetensors") and "token" not in item.name:
            shutil.copy(item, path / item.name)
    tokenizer = train_tokenizer(512 - len(HARMONY_MARKERS), 256)
    tokenizer.add_special_tokens({"additional_special_tokens": HARMONY_MARKERS})
    tokenizer.save_pretrained(str(path))
    return path


def test_under_harmony_the_grammar_waits_for_the_final_channel(harmony_model):
    """gpt-oss's answer starts after <|channel|>final<|message|> (special tokens and a word): the grammar sleeps until
    that sequence, and the markers the parser reads stay in the text when special tokens are kept."""
    llm = LLM(model=str(harmony_model), reasoning_parser="openai_gptoss", max_model_len=256)
    channel, message = (llm.tokenizer.convert_tokens_to_ids(marker) for marker in ("<|channel|>", "<|message|>"))
    assert channel >= 505 and message >= 505
    structured = llm.model_runner.structured_outputs
    end = structured.reasoning_tags[1]
    assert end[0] == channel and end[-1] == message and len(end) >= 3
    grammar = structured.new_request_grammar("r", StructuredOutputsParams(choice=CHOICES), [1, 5, 6])
    analysis = llm.tokenizer.encode("<|channel|>analysis<|message|>hm<|end|><|start|>assistant", add_special_tokens=False)
    for token in analysis:
        grammar.accept(token)
    assert not grammar.constrains
    for token in end:
        grammar.accept(token)
    assert grammar.constrains and grammar.start == len(analysis) + len(end)
    kept = llm.generate(["x"], SamplingParams(max_tokens=2, logit_bias={channel: 100.0}, skip_special_tokens=False),
                        use_tqdm=False)[0].outputs[0].text
    skipped = llm.generate(["x"], SamplingParams(max_tokens=2, logit_bias={channel: 100.0}), use_tqdm=False)[0]
    assert kept == "<|channel|><|channel|>" and skipped.outputs[0].text == ""
