"""Parallel sampling (``SamplingParams.n > 1``): one user request fanned out into ``n`` engine requests.

As in vLLM's V1 front end, the core never sees ``n``: each of the ``n`` completions is its own request
(``f"{index}_{request_id}"``) with ``n = 1``, so the scheduler, the KV-block manager and the simulator
stay unchanged. The children have the same prompt and arrive together, so prefix caching computes the
prompt's full blocks once and the others read them. With a ``seed``, child ``index`` samples with
``seed + index``: the completions differ, and each is reproducible on its own. Every child keeps the
other parameters, prompt logprobs included (as vLLM's children do: a request that asks for them skips
the prefix cache, so each child then prefills the prompt itself, and each output carries them).

``ParentRequest`` turns the children's outputs back into the user's:
- ``final``: one RequestOutput once every child has finished, its ``outputs`` in index order;
- ``delta``: each child output as it comes, relabelled with the parent's id and the child's index;
- ``cumulative``: the latest completion of every child heard from so far, in index order.
Invariant: the parent's output is ``finished`` exactly once, with the last child's last output; each
CompletionOutput carries its own child's finish reason.
"""

from __future__ import annotations

import dataclasses

from engine.core.sampling_params import SamplingParams
from engine.output_processor.request_state import OutputKind
from engine.outputs import CompletionOutput, RequestMetrics, RequestOutput


def child_request_id(parent_id: str, index: int) -> str:
    return f"{index}_{parent_id}"


def child_sampling_params(params: SamplingParams, index: int) -> SamplingParams:
    """Child ``index``'s parameters: n = 1 and its own seed; the rest as the parent's."""
    child = dataclasses.replace(params, n=1)
    if params.seed is not None:
        # Set after construction, which reads a seed of -1 as "unseeded" (the parent's validation
        # already checked that every seed + i is a valid seed).
        child.seed = params.seed + index
    return child


class ParentRequest:
    def __init__(self, request_id: str, params: SamplingParams, output_kind: OutputKind) -> None:
        self.request_id = request_id
        self.n = params.n
        self.output_kind = output_kind
        self.child_ids = [child_request_id(request_id, index) for index in range(self.n)]
        self.child_params = [child_sampling_params(params, index) for index in range(self.n)]
        self._index_of = {child_id: index for index, child_id in enumerate(self.child_ids)}
        self._latest: dict[int, CompletionOutput] = {}  # index -> its latest completion (final, cumulative)
        # The children's timing folded as it comes (_merge_metrics), not recomputed over all n per output:
        # that was O(n) per output on the event loop, 44 s of a stalled server for n=16384.
        self._merged: RequestMetrics | None = None
        self._generation_tokens: dict[int, int] = {}  # index -> its latest num_generation_tokens
        self._finished: set[int] = set()
        self._prompt_logprobs = None

    @property
    def finished(self) -> bool:
        return len(self._finished) == self.n

    def add_child_output(self, output: RequestOutput) -> RequestOutput | None:
        """The parent's output for this child output, or None while a ``final`` parent still waits."""
        index = self._index_of[output.request_id]
        completion = dataclasses.replace(output.outputs[0], index=index)
        if output.finished:
            self._finished.add(index)
        if output.prompt_logprobs is not None:  # the same for every child
            self._prompt_logprobs = output.prompt_logprobs
        if output.metrics is not None:
            self._merge_metrics(index, output.metrics)
        if self.output_kind == "delta":
            completions = [completion]
        else:
            self._latest[index] = completion
            if self.output_kind == "final" and not self.finished:
                return None
            completions = [self._latest[i] for i in sorted(self._latest)]
        return dataclasses.replace(
            output, request_id=self.request_id, outputs=completions, finished=self.finished,
            prompt_logprobs=self._prompt_logprobs, metrics=self._merged_metrics())

    def _merge_metrics(self, index: int, metrics: RequestMetrics) -> None:
        """Fold one child's latest timing into the request's. A child's arrival, first scheduling, first token
        and finish are set once and its last token only moves later, so the earliest and latest seen so far
        are those over every child's latest metrics; its token count replaces its previous one."""
        previous_tokens = self._generation_tokens.get(index, 0)
        self._generation_tokens[index] = metrics.num_generation_tokens
        merged = self._merged
        if merged is None:
            self._merged = dataclasses.replace(metrics)
            return
        merged.arrival_time = min(merged.arrival_time, metrics.arrival_time)
        for name in ("first_scheduled_time", "first_token_time"):
            value, current = getattr(metrics, name), getattr(merged, name)
            if value is not None and (current is None or value < current):
                setattr(merged, name, value)
        for name in ("last_token_time", "finished_time"):
            value, current = getattr(metrics, name), getattr(merged, name)
            if value is not None and (current is None or value > current):
                setattr(merged, name, value)
        merged.num_generation_tokens += metrics.num_generation_tokens - previous_tokens

    def _merged_metrics(self) -> RequestMetrics | None:
        """The request's timing as the user saw it: first token of any child, finish of the last."""
        if self._merged is None:
            return None
        return dataclasses.replace(self._merged, finished_time=self._merged.finished_time if self.finished else None)
