"""AsyncLLM with ``n > 1``: the n completions stream through one iterator, each delta with its index; they
add up to the offline output; aborting the request by its own id aborts every completion."""

import asyncio

import pytest

from engine import LLM, SamplingParams
from engine.async_llm import AsyncLLM

SEEDED = SamplingParams(n=3, temperature=1.0, seed=17, max_tokens=9, ignore_eos=True)
LONG = SamplingParams(n=4, temperature=0.0, max_tokens=400, ignore_eos=True)
ENGINE_OPTIONS = dict(max_num_seqs=16, num_gpu_blocks=256, max_model_len=512)


@pytest.fixture(scope="module")
def async_llm(tiny_model_path):
    llm = AsyncLLM(model=str(tiny_model_path), **ENGINE_OPTIONS)
    yield llm
    llm.shutdown()


async def wait_idle(llm, timeout=10.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        stats = llm.get_stats()
        if stats.num_running_reqs == 0 and stats.num_waiting_reqs == 0:
            return stats
        assert asyncio.get_running_loop().time() < deadline, stats
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("output_kind", ["delta", "cumulative"])
def test_streamed_completions_add_up_to_the_offline_output(async_llm, tiny_model_path, output_kind):
    prompt = "Parallel sampling shares a prompt"
    expected = LLM(model=str(tiny_model_path), **ENGINE_OPTIONS).generate([prompt], SEEDED, use_tqdm=False)[0]

    async def run():
        return [output async for output in async_llm.generate(prompt, SEEDED, "parent", output_kind=output_kind)]

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
        async for output in async_llm.generate("to be aborted", LONG, "victims"):
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
        stream = async_llm.generate("left early", LONG, "leaver")
        async for _ in stream:
            break
        await stream.aclose()
        stats = await wait_idle(async_llm)
        assert stats.kv_cache_free_blocks == stats.kv_cache_usable_blocks

    asyncio.run(run())
