"""A completions request with a batch of prompts: one engine request per prompt, their outputs merged.

OpenAI's and vLLM's ``/v1/completions`` take ``prompt`` as a list of prompts; the response holds
``n`` choices per prompt, prompt ``p``'s choice ``i`` at index ``p * n + i``. Each prompt is an ordinary
``AsyncLLM.generate`` stream; ``merge_prompt_streams`` interleaves them in the order their outputs
arrive, tagging each with its prompt. Invariant: the merged stream says ``finished`` once, on the last
output of the last prompt to finish; an error in any prompt's stream ends the merge with that error,
and leaving the merge early (a client that went away) closes every prompt's stream, which aborts its
request in the engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from engine.outputs import RequestOutput


@dataclass(slots=True)
class PromptOutput:
    prompt_index: int
    output: RequestOutput
    finished: bool  # every prompt's request has finished (this is the merged stream's last output)


_STREAM_DONE = object()


async def merge_prompt_streams(streams: list[AsyncIterator[RequestOutput]]) -> AsyncIterator[PromptOutput]:
    if len(streams) == 1:  # the usual request: no tasks or queue in the way
        async for output in streams[0]:
            yield PromptOutput(0, output, output.finished)
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(prompt_index: int, stream: AsyncIterator[RequestOutput]) -> None:
        try:
            async for output in stream:
                queue.put_nowait((prompt_index, output))
            queue.put_nowait((prompt_index, _STREAM_DONE))
        except Exception as error:  # handed to the consumer, which raises it
            queue.put_nowait((prompt_index, error))

    tasks = [asyncio.create_task(pump(index, stream)) for index, stream in enumerate(streams)]
    unfinished, finished_prompts = len(streams), set()
    try:
        while unfinished:
            prompt_index, item = await queue.get()
            if isinstance(item, Exception):
                raise item
            if item is _STREAM_DONE:
                if prompt_index not in finished_prompts:  # AsyncLLM.generate always ends with a finished output
                    raise RuntimeError(f"prompt {prompt_index}'s stream ended before its request finished")
                continue
            if item.finished:
                finished_prompts.add(prompt_index)
                unfinished -= 1
            yield PromptOutput(prompt_index, item, unfinished == 0)
    finally:
        for task in tasks:
            task.cancel()  # a stream cancelled before it finished aborts its request (AsyncLLM.generate)
        await asyncio.gather(*tasks, return_exceptions=True)
