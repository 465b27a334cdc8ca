"""LLM.generate's contract: prompt forms, input order, EOS and min_tokens, bad words, timing fields,
model selection by name, and engine access for tests and tools."""

import pytest

import engine.engine_args
from engine import LLM, RequestOutput, SamplingParams
from engine.core import EngineCore, Executor

GREEDY = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_llama_path):
    return LLM(model=str(tiny_llama_path), max_num_seqs=8)


def test_prompt_forms_and_input_order(llm):
    tokenizer = llm.get_tokenizer()
    text = "The engine schedules requests"
    ids = tokenizer(text).input_ids
    by_text = llm.generate(text, GREEDY, use_tqdm=False)
    assert len(by_text) == 1 and isinstance(by_text[0], RequestOutput)
    assert by_text[0].prompt == text and by_text[0].prompt_token_ids == ids
    expected = by_text[0].outputs[0].token_ids
    forms = [ids, {"prompt_token_ids": ids}, {"prompt": text}, [ids, [9, 10, 11]], [text, "Another prompt"],
             [{"prompt_token_ids": ids, "prompt": text}]]
    for form in forms:
        outputs = llm.generate(form, GREEDY, use_tqdm=False)
        assert outputs[0].outputs[0].token_ids == expected, form
        assert outputs[0].outputs[0].text == tokenizer.decode(expected, skip_special_tokens=True)
    assert llm.generate([], GREEDY, use_tqdm=False) == []
    # Many prompts of different lengths finish in a different order than submitted; outputs do not.
    prompts = [[5 + i] * (40 - 3 * i) for i in range(10)]
    params = [SamplingParams(temperature=0.0, max_tokens=2 + (7 * i) % 9, ignore_eos=True) for i in range(10)]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.prompt_token_ids for o in outputs] == prompts
    assert [len(o.outputs[0].token_ids) for o in outputs] == [p.max_tokens for p in params]
    assert len({o.request_id for o in outputs}) == 10


def test_progress_bar(llm, capsys):
    llm.generate(["one", "two", "three"], GREEDY, use_tqdm=True)
    assert "Processed prompts" in capsys.readouterr().err


def test_eos_min_tokens_and_default_params(llm):
    eos = llm.get_tokenizer().eos_token_id
    push_eos = {eos: 100.0}
    output = llm.generate("x", SamplingParams(temperature=0.0, max_tokens=8, logit_bias=push_eos), use_tqdm=False)
    completion = output[0].outputs[0]
    assert completion.token_ids == [eos] and completion.text == ""
    assert (completion.finish_reason, completion.stop_reason) == ("stop", None)
    held = llm.generate("x", SamplingParams(temperature=0.0, max_tokens=8, logit_bias=push_eos, min_tokens=3),
                        use_tqdm=False)[0].outputs[0]
    assert len(held.token_ids) == 4 and held.token_ids[-1] == eos and eos not in held.token_ids[:3]
    defaults = llm.generate("x", use_tqdm=False)[0].outputs[0]  # vLLM's defaults: 16 tokens, temperature 1
    assert 1 <= len(defaults.token_ids) <= 16


def test_bad_words_are_never_generated(llm):
    first = llm.generate("x", GREEDY, use_tqdm=False)[0].outputs[0].token_ids[0]
    word = llm.get_tokenizer().decode([first])
    banned = llm.generate("x", SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, bad_words=[word]),
                          use_tqdm=False)[0].outputs[0]
    assert first not in banned.token_ids


def test_timing_fields(llm):
    output = llm.generate(["timing", "two"], GREEDY, use_tqdm=False)[0]
    metrics = output.metrics
    assert metrics.arrival_time <= metrics.first_scheduled_time <= metrics.first_token_time
    assert metrics.first_token_time <= metrics.last_token_time <= metrics.finished_time
    assert metrics.num_generation_tokens == 5 and metrics.time_to_first_token >= 0
    assert output.finished and output.outputs[0].finished()


def test_engine_access(llm):
    assert isinstance(llm.engine_core, EngineCore) and llm.llm_engine is llm.engine_core
    assert isinstance(llm.executor, Executor)
    llm.generate("step time", GREEDY, use_tqdm=False)
    assert llm.executor.last_step_duration_s > 0
    manager = llm.scheduler.kv_cache_manager
    assert manager.num_usable_blocks == llm.model_runner.num_gpu_blocks - 1


def test_skip_tokenizer_init(tiny_llama_path):
    llm = LLM(model=str(tiny_llama_path), skip_tokenizer_init=True, max_num_seqs=2)
    assert llm.get_tokenizer() is None
    output = llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)[0]
    assert len(output.outputs[0].token_ids) == 5 and output.outputs[0].text == ""
    with pytest.raises(ValueError, match="prompt 0 is text but the engine has no tokenizer"):
        llm.generate("text", GREEDY, use_tqdm=False)


def test_models_by_name(monkeypatch, tmp_path, tiny_llama_path):
    requested = []

    def fake_default_model_path(size):
        requested.append(size)
        return tiny_llama_path

    monkeypatch.setattr(engine.engine_args, "default_model_path", fake_default_model_path)
    LLM(max_num_seqs=2)  # the default is the generated "small" model
    LLM(model="tiny", max_num_seqs=2)
    assert requested == ["small", "tiny"]
