"""AsyncLLM's contract: streamed deltas add up to the offline result; leaving early, aborting and
shutting down free every block; one bad request or one failed step does not stop the others; n > 1
completions stream together and abort together."""

import asyncio
import contextlib

import pytest

from engine import LLM, SamplingParams
from engine.async_llm import AsyncLLM, EngineDeadError, EngineStepError
from engine.output_processor.stop_strings import stop_string_hold_back

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
LONG = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)
ENGINE_OPTIONS = dict(max_num_seqs=16, num_gpu_blocks=256, max_model_len=512)


@pytest.fixture(scope="module")
def async_llm(tiny_model_path):
    llm = AsyncLLM(model=str(tiny_model_path), **ENGINE_OPTIONS)
    yield llm
    llm.shutdown()


@pytest.fixture(scope="module")
def offline_llm(tiny_model_path):
    return LLM(model=str(tiny_model_path), **ENGINE_OPTIONS)


async def collect(llm, prompt, params, request_id=None, **kwargs):
    outputs = [output async for output in llm.generate(prompt, params, request_id, **kwargs)]
    return outputs


async def wait_idle(llm, timeout=10.0):
    """Until no request runs or waits (stats are refreshed after every step), then the stats."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        stats = llm.get_stats()
        if stats.num_running_reqs == 0 and stats.num_waiting_reqs == 0:
            return stats
        assert asyncio.get_running_loop().time() < deadline, stats
        await asyncio.sleep(0.01)


def assert_all_blocks_free(stats):
    assert stats.kv_cache_free_blocks == stats.kv_cache_usable_blocks


def test_deltas_add_up_to_the_offline_output(async_llm, offline_llm):
    prompts = ["The engine schedules requests", [5, 6, 7, 8, 9], {"prompt": "Hello there"}]
    expected = offline_llm.generate(prompts, GREEDY, use_tqdm=False)

    async def run():
        return await asyncio.gather(*(collect(async_llm, prompt, GREEDY) for prompt in prompts))

    for outputs, reference in zip(asyncio.run(run()), expected):
        assert [o.finished for o in outputs] == [False] * (len(outputs) - 1) + [True]
        assert "".join(o.outputs[0].text for o in outputs) == reference.outputs[0].text
        assert sum((o.outputs[0].token_ids for o in outputs), []) == reference.outputs[0].token_ids
        assert outputs[-1].outputs[0].finish_reason == "length"
        assert outputs[-1].metrics.first_token_time >= outputs[-1].metrics.arrival_time


def test_cumulative_outputs_and_request_ids(async_llm):
    async def run():
        outputs = await collect(async_llm, "cumulative", GREEDY, "my-id", output_kind="cumulative")
        lengths = [len(o.outputs[0].token_ids) for o in outputs]
        assert lengths == sorted(lengths) and lengths[-1] == 12
        assert {o.request_id for o in outputs} == {"my-id"}
        # The id is free again once the request finished.
        assert len(await collect(async_llm, "again", GREEDY, "my-id")) >= 1

    asyncio.run(run())


def test_a_bad_prompt_fails_its_own_iterator_only(async_llm):
    async def run():
        good = asyncio.create_task(collect(async_llm, "a good prompt", GREEDY))
        with pytest.raises(ValueError, match="prompt is empty"):
            await collect(async_llm, "", GREEDY)
        with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 512\)"):
            await collect(async_llm, [1, 2, 100_000], GREEDY)
        with pytest.raises(ValueError, match="more than the engine allows"):
            await collect(async_llm, [7] * 600, GREEDY)
        outputs = await good
        assert outputs[-1].finished and len(sum((o.outputs[0].token_ids for o in outputs), [])) == 12
        assert_all_blocks_free(await wait_idle(async_llm))

    asyncio.run(run())


def test_duplicate_request_id_is_refused(async_llm):
    async def run():
        first = async_llm.generate("one", LONG, "dup")
        await first.__anext__()
        with pytest.raises(ValueError, match="already being served"):
            await collect(async_llm, "two", GREEDY, "dup")
        await first.aclose()
        assert_all_blocks_free(await wait_idle(async_llm))

    asyncio.run(run())


def test_cancelling_or_leaving_early_aborts_and_frees_blocks(async_llm):
    async def consume(count):
        async for index, _ in _enumerate(async_llm.generate("a long answer", LONG)):
            if index + 1 == count:
                await asyncio.sleep(30)  # the client hangs here until cancelled

    async def run():
        before = async_llm.get_stats().finished_requests["abort"]
        task = asyncio.create_task(consume(2))
        await asyncio.sleep(0.3)
        assert async_llm.get_stats().num_running_reqs == 1
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        # Leaving an ``async for`` closes the generator (aclosing makes that immediate).
        async with contextlib.aclosing(async_llm.generate("another long answer", LONG)) as outputs:
            async for _ in outputs:
                break
        stats = await wait_idle(async_llm)
        assert_all_blocks_free(stats)
        assert stats.finished_requests["abort"] == before + 2

    asyncio.run(run())


def test_abort_ends_the_iterator_with_finish_reason_abort(async_llm):
    async def run():
        outputs = []
        async for output in async_llm.generate("to be aborted", LONG, "victim"):
            outputs.append(output)
            if len(outputs) == 2:
                async_llm.abort("victim")
        assert outputs[-1].finished and outputs[-1].outputs[0].finish_reason == "abort"
        assert len(sum((o.outputs[0].token_ids for o in outputs), [])) < LONG.max_tokens
        assert_all_blocks_free(await wait_idle(async_llm))

    asyncio.run(run())


def test_a_failed_step_fails_its_requests_and_the_engine_goes_on(async_llm):
    executor = async_llm._engine_loop.executor
    real_execute = executor.execute_model
    calls = []

    def fail_once(scheduler_output):
        if not calls and scheduler_output.total_num_scheduled_tokens:
            calls.append(1)
            raise RuntimeError("injected model failure")
        return real_execute(scheduler_output)

    async def run():
        errors_before = async_llm.get_stats().finished_requests["error"]
        executor.execute_model = fail_once
        try:
            with pytest.raises(EngineStepError, match="injected model failure"):
                await collect(async_llm, "doomed", GREEDY)
        finally:
            executor.execute_model = real_execute
        assert_all_blocks_free(await wait_idle(async_llm))
        assert async_llm.get_stats().finished_requests["error"] == errors_before + 1  # counted, not lost
        outputs = await collect(async_llm, "after the failure", GREEDY)
        assert outputs[-1].outputs[0].finish_reason == "length"

    asyncio.run(run())


def test_stop_strings_never_stream_text_that_is_cut_later(async_llm):
    async def run(params):
        return await collect(async_llm, "stop here", params)

    pieces = [o.outputs[0].text for o in asyncio.run(run(GREEDY))]
    text = "".join(pieces)
    # A stop string that starts at the end of one step's text and ends in the next one's: without a
    # hold-back its first character would be streamed before the match is known.
    for index in range(1, len(pieces) - 1):
        start = sum(len(piece) for piece in pieces[:index]) - 1
        stop = text[start:start + 3]
        if len(pieces[index - 1]) >= 1 and len(pieces[index]) >= 2 and text.index(stop) == start:
            break
    else:
        pytest.skip(f"no stop string straddles two steps in {pieces!r}")
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, stop=[stop])
    outputs = asyncio.run(run(params))
    streamed = [o.outputs[0].text for o in outputs]
    assert "".join(streamed) == text[:start], (streamed, stop)
    assert outputs[-1].outputs[0].finish_reason == "stop" and outputs[-1].outputs[0].stop_reason == stop


@pytest.mark.parametrize("text,stop,held", [
    ("hello wor", ["world"], 3), ("hello", ["world"], 0), ("abcab", ["abc"], 2), ("xx", ["x", "xy"], 1),
    ("a", ["abcdef", "b"], 1), ("", ["stop"], 0), ("the end", ["end"], 0),
])
def test_stop_string_hold_back(text, stop, held):
    assert stop_string_hold_back(text, stop) == held


def test_shutdown_aborts_requests_in_flight(tiny_model_path):
    async def run():
        llm = AsyncLLM(model=str(tiny_model_path), **ENGINE_OPTIONS)
        outputs = []

        async def consume():
            async for output in llm.generate("in flight at shutdown", LONG):
                outputs.append(output)

        async with llm:
            task = asyncio.create_task(consume())
            while not outputs:
                await asyncio.sleep(0.01)
        await asyncio.wait_for(task, 10)
        assert outputs[-1].finished and outputs[-1].outputs[0].finish_reason == "abort"
        assert not llm.is_running
        assert_all_blocks_free(llm.get_stats())
        with pytest.raises(EngineDeadError):
            await collect(llm, "too late", GREEDY)

    asyncio.run(run())


async def _enumerate(iterator):
    index = 0
    async for item in iterator:
        yield index, item
        index += 1


# Parallel sampling (n > 1): the n completions stream through one iterator, each delta with its index; they
# add up to the offline output; aborting the request by its own id aborts every completion.
SEEDED_N = SamplingParams(n=3, temperature=1.0, seed=17, max_tokens=9, ignore_eos=True)
LONG_N = SamplingParams(n=4, temperature=0.0, max_tokens=400, ignore_eos=True)


@pytest.mark.parametrize("output_kind", ["delta", "cumulative"])
def test_streamed_completions_add_up_to_the_offline_output(async_llm, tiny_model_path, output_kind):
    prompt = "Parallel sampling shares a prompt"
    expected = LLM(model=str(tiny_model_path), **ENGINE_OPTIONS).generate([prompt], SEEDED_N, use_tqdm=False)[0]

    async def run():
        return [output async for output in async_llm.generate(prompt, SEEDED_N, "parent", output_kind=output_kind)]

    outputs = asyncio.run(run())
    assert [output.finished for output in outputs] == [False] * (len(outputs) - 1) + [True]
    assert {output.request_id for output in outputs} == {"parent"}
    streamed: dict[int, tuple[str, list[int]]] = {}
    finish_reasons = {}
    for output in outputs:
        for completion in output.outputs:
            if completion.finish_reason is not None:
                finish_reasons[completion.index] = completion.finish_reason
            text, token_ids = streamed.get(completion.index, ("", []))
            streamed[completion.index] = ((text + completion.text, token_ids + completion.token_ids)
                                          if output_kind == "delta" else (completion.text, completion.token_ids))
    assert streamed == {c.index: (c.text, c.token_ids) for c in expected.outputs}
    assert finish_reasons == {0: "length", 1: "length", 2: "length"}


def test_abort_by_the_request_id_ends_every_completion(async_llm):
    async def run():
        before = async_llm.get_stats().finished_requests["abort"]
        finish_reasons = {}
        async for output in async_llm.generate("to be aborted", LONG_N, "victims"):
            for completion in output.outputs:
                if completion.finish_reason is not None:
                    finish_reasons[completion.index] = completion.finish_reason
            if not finish_reasons and sum(len(c.token_ids) for c in output.outputs) > 0:
                async_llm.abort("victims")
        assert finish_reasons == {index: "abort" for index in range(4)}
        stats = await wait_idle(async_llm)
        assert stats.finished_requests["abort"] == before + 4
        assert stats.kv_cache_free_blocks == stats.kv_cache_usable_blocks

    asyncio.run(run())


def test_leaving_early_aborts_every_completion(async_llm):
    async def run():
        stream = async_llm.generate("left early", LONG_N, "leaver")
        async for _ in stream:
            break
        await stream.aclose()
        stats = await wait_idle(async_llm)
        assert stats.kv_cache_free_blocks == stats.kv_cache_usable_blocks

    asyncio.run(run())


def test_an_id_taken_by_another_requests_completion_is_refused_without_harming_it(async_llm):
    """Completion 0 of request "x" is engine request "0_x": a request that would take an id in use is
    refused before it reaches the engine, whichever came first, and the request in flight runs to its end."""
    async def run():
        for first_id, first_params, second_id, second_params in [
                ("0_x", SamplingParams(max_tokens=300, ignore_eos=True), "x", LONG_N),
                ("y", LONG_N, "0_y", SamplingParams(max_tokens=300, ignore_eos=True))]:
            first = async_llm.generate("in flight", first_params, first_id)
            await first.__anext__()
            with pytest.raises(ValueError, match="already being served"):
                async for _ in async_llm.generate("colliding", second_params, second_id):
                    pass
            finish_reasons = {}
            async for output in first:
                for completion in output.outputs:
                    if completion.finish_reason is not None:
                        finish_reasons[completion.index] = completion.finish_reason
            assert set(finish_reasons.values()) == {"length"}
            stats = await wait_idle(async_llm)
            assert stats.kv_cache_free_blocks == stats.kv_cache_usable_blocks

    asyncio.run(run())


def test_beam_search_equals_the_offline_one_and_cancelling_frees_blocks(async_llm, offline_llm):
    from engine.beam_search import BeamSearchParams

    params = BeamSearchParams(beam_width=3, max_tokens=6, ignore_eos=True)
    expected = offline_llm.beam_search(["beam me up"], params)[0]

    async def run():
        output = await async_llm.beam_search("beam me up", params, "beam-id")
        assert [(s.tokens, s.text) for s in output.sequences] == [(s.tokens, s.text) for s in expected.sequences]
        for got, want in zip(output.sequences, expected.sequences):
            assert got.cum_logprob == pytest.approx(want.cum_logprob, abs=1e-5)
        long_search = asyncio.create_task(
            async_llm.beam_search("beam me up", BeamSearchParams(beam_width=4, max_tokens=300, ignore_eos=True)))
        await asyncio.sleep(0.3)
        assert not long_search.done()
        long_search.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await long_search
        assert_all_blocks_free(await wait_idle(async_llm))

    asyncio.run(run())
