"""Bad input gets a clear ValueError before anything reaches the engine, and never leaves it broken:
the next call is served and every KV block is free afterwards."""

import pytest

from engine import LLM, SamplingParams

GOOD = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_llama_path):
    return LLM(model=str(tiny_llama_path), max_num_seqs=8, max_model_len=128)


def assert_healthy(llm):
    outputs = llm.generate(["a good prompt", [5, 6, 7]], GOOD, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [4, 4]
    scheduler = llm.scheduler
    manager = scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks
    assert scheduler.get_num_unfinished_requests() == 0 and not llm.output_processor.has_unfinished_requests()


@pytest.mark.parametrize("prompts,message", [
    (["fine", [7] * 200], r"prompt 1 has 200 tokens, more than the engine allows: 128"),
    (["fine", []], r"prompt 1 is empty"),
    ([{"prompt_token_ids": []}], r"prompt 0 is empty"),
    (["fine", [3, 99999]], r"prompt 1 has token id\(s\) \[99999\] outside the vocabulary \[0, 512\)"),
    ([[1, -2]], r"prompt 0 has token id\(s\) \[-2\]"),
    ([{"text": "x"}], r"prompt 0: a dict prompt needs 'prompt_token_ids' or 'prompt'"),
    ([3.5], r"prompt 0 must be a string"),
])
def test_bad_prompts_raise_and_leave_nothing_behind(llm, prompts, message):
    with pytest.raises(ValueError, match=message):
        llm.generate(prompts, GOOD, use_tqdm=False)
    assert_healthy(llm)


@pytest.mark.parametrize("kwargs,field", [
    (dict(temperature=-1.0), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(stop=[""]), "stop"),
    (dict(n=0), "n"),
    (dict(n=2, seed=2**64 - 1), "seed"),
])
def test_invalid_sampling_params_raise_at_construction(kwargs, field):
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field}"):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("params,message", [
    (SamplingParams(logprobs=10_000), r"SamplingParams.logprobs must be <= the vocabulary size 512"),
    (SamplingParams(allowed_token_ids=[1, 600]), r"allowed_token_ids has token id\(s\) \[600\]"),
    (SamplingParams(logit_bias={700: 1.0}), r"logit_bias has token id\(s\) \[700\]"),
    (SamplingParams(stop_token_ids=[3, 512]), r"stop_token_ids has token id\(s\) \[512\]"),
    ([GOOD, GOOD, GOOD], r"got 3 SamplingParams for 2 prompts"),
])
def test_params_the_model_cannot_honor(llm, params, message):
    with pytest.raises(ValueError, match=message):
        llm.generate(["one", "two"], params, use_tqdm=False)
    assert_healthy(llm)


def test_seeds_at_the_ends_of_torchs_range_sample(llm):
    """SamplingParams' seed range is exactly what torch.Generator.manual_seed takes (one past is refused
    at construction: tests/core/test_sampling_params.py)."""
    seeds = [-(2**63), 2**64 - 1]
    params = [SamplingParams(temperature=1.0, seed=seed, max_tokens=2, ignore_eos=True) for seed in seeds]
    outputs = llm.generate(["a", "b"], params, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [2, 2]
    assert_healthy(llm)


def test_the_length_limit_names_the_unchunked_budget(tiny_llama_path, caplog):
    """Without chunked prefill the budget caps the prompt; the message says so rather than citing only
    max_model_len, which is larger, and the engine said so when it started."""
    with caplog.at_level("WARNING", logger="engine.engine_components"):
        llm = LLM(model=str(tiny_llama_path), max_num_seqs=2, max_model_len=128, max_num_batched_tokens=16,
                  enable_chunked_prefill=False, num_gpu_blocks=16)
    assert "serves sequences of up to 16 tokens, not max_model_len=128" in caplog.text
    assert "the step budget without chunked prefill is 16" in caplog.text
    with pytest.raises(ValueError, match=r"more than the engine allows: 16 \(max_model_len=128, .*"
                                         r"max_num_batched_tokens=16 without chunked prefill\)"):
        llm.generate([[7] * 21], GOOD, use_tqdm=False)


def test_failure_inside_a_step_aborts_the_call(llm, monkeypatch):
    """An exception mid-generation (a runner error, Ctrl-C) aborts the call's requests: blocks return."""
    runner = llm.model_runner
    execute_model = runner.execute_model
    calls = []

    def failing(scheduler_output):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("device lost")
        return execute_model(scheduler_output)

    monkeypatch.setattr(runner, "execute_model", failing)
    with pytest.raises(RuntimeError, match="device lost"):
        llm.generate(["first", "second", "third"], SamplingParams(max_tokens=10, ignore_eos=True), use_tqdm=False)
    monkeypatch.undo()
    assert_healthy(llm)


def test_text_features_need_a_tokenizer(tiny_llama_path):
    llm = LLM(model=str(tiny_llama_path), skip_tokenizer_init=True, max_num_seqs=2)
    for params, field in ((SamplingParams(stop=["x"]), "stop"), (SamplingParams(bad_words=["x"]), "bad_words")):
        with pytest.raises(ValueError, match=rf"prompt 0: SamplingParams.{field} needs a tokenizer"):
            llm.generate([[5, 6]], params, use_tqdm=False)


def test_bad_engine_configuration(tmp_path, tiny_llama_path):
    with pytest.raises(ValueError, match="config.json"):
        LLM(model=str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="max_model_len 4096 exceeds what model"):
        LLM(model=str(tiny_llama_path), max_model_len=4096)
    with pytest.raises(ValueError, match="block_size"):
        LLM(model=str(tiny_llama_path), block_size=0)
    with pytest.raises(ValueError, match="KV cache budget"):
        LLM(model=str(tiny_llama_path), kv_cache_memory_bytes=100)
    with pytest.raises(ValueError, match="skip_tokenizer_init"):
        LLM(model=str(tiny_llama_path), tokenizer=str(tmp_path))


def test_a_kv_pool_smaller_than_max_model_len_is_reported_at_start(tiny_llama_path, caplog):
    """The pool caps the longest sequence below max_model_len: served, but not silently."""
    with caplog.at_level("WARNING", logger="engine.engine_components"):
        LLM(model=str(tiny_llama_path), max_num_seqs=2, max_model_len=128, num_gpu_blocks=5, block_size=16)
    assert "up to 64 tokens, not max_model_len=128: the KV cache holds 64 tokens (4 usable blocks of 16)" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="engine.engine_components"):
        LLM(model=str(tiny_llama_path), max_num_seqs=2, max_model_len=64, num_gpu_blocks=5, block_size=16)
    assert "serves sequences of up to" not in caplog.text  # the pool holds exactly max_model_len: nothing to say


def test_a_prompt_as_long_as_max_model_len_gets_one_token(llm):
    """A prompt may fill max_model_len (as in vLLM): the token sampled at its last position is the only
    output, finished by length. Its append used to overrun the runner's token buffer and fail the step,
    and with it every request in flight."""
    full, beside = llm.generate([[5] * 128, [6] * 10], SamplingParams(max_tokens=5, ignore_eos=True), use_tqdm=False)
    assert len(full.outputs[0].token_ids) == 1 and full.outputs[0].finish_reason == "length"
    assert len(beside.outputs[0].token_ids) == 5
    assert_healthy(llm)
