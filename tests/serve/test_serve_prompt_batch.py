"""merge_prompt_streams: every prompt's outputs come through, tagged; ``finished`` once, at the very end;
an error in one prompt's stream ends the merge and closes the others (which aborts their requests)."""

import asyncio

import pytest

from engine.outputs import CompletionOutput, RequestOutput
from engine.serve.prompt_batch import merge_prompt_streams


def output(request_id, token, finished):
    completion = CompletionOutput(0, str(token), [token], None, None, "length" if finished else None)
    return RequestOutput(request_id, None, [1], None, [completion], finished)


async def stream(request_id, num_outputs, closed, fail_after=None):
    try:
        for step in range(num_outputs):
            await asyncio.sleep(0.001 * (1 + step % 3))
            if fail_after is not None and step == fail_after:
                raise ValueError(f"{request_id} failed")
            yield output(request_id, step, step == num_outputs - 1)
        await asyncio.sleep(0)
    finally:
        closed.append(request_id)


def test_outputs_of_every_prompt_come_through_and_finish_once():
    async def run():
        closed = []
        merged = [item async for item in merge_prompt_streams([stream("a", 5, closed), stream("b", 2, closed),
                                                               stream("c", 7, closed)])]
        return merged, closed

    merged, closed = asyncio.run(run())
    for index, request_id, count in ((0, "a", 5), (1, "b", 2), (2, "c", 7)):
        mine = [item.output for item in merged if item.prompt_index == index]
        assert [o.request_id for o in mine] == [request_id] * count
        assert [o.outputs[0].token_ids[0] for o in mine] == list(range(count))
    assert [item.finished for item in merged] == [False] * (len(merged) - 1) + [True]
    assert sorted(closed) == ["a", "b", "c"]


def test_an_error_in_one_stream_ends_the_merge_and_closes_the_others():
    async def run():
        closed = []
        with pytest.raises(ValueError, match="b failed"):
            async for _ in merge_prompt_streams([stream("a", 50, closed), stream("b", 50, closed, fail_after=3)]):
                pass
        return closed

    assert sorted(asyncio.run(run())) == ["a", "b"]
