"""The mailbox between the engine thread and one ``AsyncLLM.generate()`` iterator (the seed's 9.2).

The engine thread hands outputs over with ``loop.call_soon_threadsafe``; everything here then runs on
the event loop, so no lock is needed. The mailbox holds at most one output: when the consumer is
slower than the engine (a slow client, a busy loop), outputs that pile up are merged into one
(vLLM's ``RequestOutputCollector`` does the same). Memory per request stays bounded and a slow
consumer simply receives bigger deltas, never a stale one.
"""

from __future__ import annotations

import asyncio
import dataclasses

from engine.output_processor.request_state import OutputKind
from engine.outputs import RequestOutput
from engine.parallel_sampling import ParentRequest


class RequestOutputCollector:
    def __init__(self, loop: asyncio.AbstractEventLoop, output_kind: OutputKind) -> None:
        self.loop = loop
        self.output_kind = output_kind
        self._output: RequestOutput | None = None
        self._error: BaseException | None = None
        self._ready = asyncio.Event()

    def put(self, output: RequestOutput) -> None:
        if self._output is None or self.output_kind != "delta":
            # Cumulative (and final) outputs already contain everything before them.
            self._output = output
        else:
            self._output = merge_delta_outputs(self._output, output)
        self._ready.set()

    def put_error(self, error: BaseException) -> None:
        self._error = error
        self._ready.set()

    async def get(self) -> RequestOutput:
        """The next (possibly merged) output; raises the request's error, once its outputs are taken."""
        while self._output is None and self._error is None:
            self._ready.clear()
            await self._ready.wait()
        output, self._output = self._output, None
        if output is None:
            raise self._error
        return output


def merge_delta_outputs(earlier: RequestOutput, later: RequestOutput) -> RequestOutput:
    """One delta output that says what ``earlier`` then ``later`` said, completion by completion (with
    parallel sampling, each may carry deltas of several completions, told apart by their index)."""
    merged = {completion.index: completion for completion in earlier.outputs}
    for second in later.outputs:
        first = merged.get(second.index)
        if first is None:
            merged[second.index] = second
            continue
        logprobs = first.logprobs
        if logprobs is not None and second.logprobs is not None:
            logprobs = logprobs + second.logprobs
        merged[second.index] = dataclasses.replace(
            second, text=first.text + second.text, token_ids=first.token_ids + second.token_ids, logprobs=logprobs)
    return dataclasses.replace(
        later, outputs=[merged[index] for index in sorted(merged)],
        prompt_logprobs=earlier.prompt_logprobs if earlier.prompt_logprobs is not None else later.prompt_logprobs)


class ChildOutputSink:
    """Where one child of a parallel-sampling request (``n > 1``) delivers: the engine thread treats it as
    the child's collector; on the event loop its outputs become the parent's and go to the one collector
    the user's iterator reads."""

    def __init__(self, parent: ParentRequest, collector: RequestOutputCollector) -> None:
        self.parent = parent
        self.collector = collector
        self.loop = collector.loop
        self.output_kind = collector.output_kind

    def put(self, output: RequestOutput) -> None:
        parent_output = self.parent.add_child_output(output)
        if parent_output is not None:
            self.collector.put(parent_output)

    def put_error(self, error: BaseException) -> None:
        self.collector.put_error(error)
