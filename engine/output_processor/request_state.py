"""One request as the front end tracks it: its text so far, logprobs, timing, and how it ended.

Output kinds (vLLM's ``RequestOutputKind``): ``final`` builds one RequestOutput when the request
finishes (what ``LLM.generate`` needs, and O(1) per step); ``cumulative`` and ``delta`` build one per
step with the whole output or only what the step added (for streaming front ends).

A stop string found in the text ends the request here, before the core knows: the caller must then
finish it in the core (``Scheduler.finish_requests(..., FINISHED_STOPPED)``). The token that completed
the stop string stays in ``token_ids``; only the text is truncated. Tokens after it that the same step
brought (speculative decoding) are dropped: the output is what steps of one token would give. Streaming
kinds hold back trailing text that may be the start of a stop string until it is known not to be
(``stop_string_hold_back``); token ids and logprobs are never held.
"""

from __future__ import annotations

from typing import Literal

from engine.core.outputs import EngineCoreOutput
from engine.core.sampling_params import SamplingParams
from engine.output_processor.detokenizer import IncrementalDetokenizer
from engine.output_processor.logprobs import LogprobsProcessor, TokenDecoder
from engine.output_processor.stop_strings import find_stop_string, stop_string_hold_back
from engine.outputs import CompletionOutput, RequestMetrics, RequestOutput

OutputKind = Literal["final", "cumulative", "delta"]


class RequestState:
    def __init__(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                 sampling_params: SamplingParams, tokenizer, decode: TokenDecoder, arrival_time: float,
                 output_kind: OutputKind = "final") -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.sampling_params = sampling_params
        self.output_kind = output_kind
        self.detokenizer = None
        if tokenizer is not None:
            self.detokenizer = IncrementalDetokenizer(tokenizer, prompt_token_ids, sampling_params.skip_special_tokens,
                                                      sampling_params.spaces_between_special_tokens)
        self.logprobs = LogprobsProcessor(decode, sampling_params.logprobs, sampling_params.prompt_logprobs)
        self.output_token_ids: list[int] = []
        self.metrics = RequestMetrics(arrival_time=arrival_time)
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.status_message: str | None = None
        self.num_cached_tokens = 0
        self._text = ""  # the visible output text (truncated at a stop string)
        # Characters of _text made by the first min_tokens tokens: no stop string may start there (vLLM).
        self._min_tokens_chars = 0
        self._sent_chars = 0  # for delta outputs
        self._sent_tokens = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def update(self, output: EngineCoreOutput, now: float) -> bool:
        """Apply one core output. Returns True if a stop string ended the request here."""
        new_token_ids = output.new_token_ids
        if len(new_token_ids) > 1 and self.detokenizer is not None and self.sampling_params.stop:
            return self._update_token_by_token(output, now)
        if new_token_ids:
            if self.metrics.first_token_time is None:
                self.metrics.first_token_time = now
            self.metrics.last_token_time = now
            self.output_token_ids.extend(new_token_ids)
            self.metrics.num_generation_tokens += len(new_token_ids)
        self.num_cached_tokens = output.num_cached_tokens
        self.logprobs.update_from_output(output.logprobs)

        stopped_by_string = False
        if self.detokenizer is not None:
            params = self.sampling_params
            text_token_ids = new_token_ids
            if output.finish_reason == "stop" and new_token_ids and not params.include_stop_str_in_output:
                # The EOS / stop token that ended the request is kept in token_ids but not in the text.
                text_token_ids = new_token_ids[:-1]
            delta = self.detokenizer.update(text_token_ids) if text_token_ids else ""
            if output.finished:
                delta += self.detokenizer.flush()
            self._text += delta
            if len(self.output_token_ids) <= params.min_tokens:
                # Within min_tokens a stop string neither ends the request nor may start (as in vLLM, whose
                # search begins after the text of the first min_tokens tokens): min_tokens=1 used to let a
                # stop string in the first token's own text end the request at once.
                self._min_tokens_chars = len(self._text)
            elif params.stop:
                match = find_stop_string(self._text, len(delta), params.stop, params.include_stop_str_in_output,
                                         self._min_tokens_chars)
                if match is not None:
                    self._text = self._text[:match.truncate_to]
                    # A stop string overrides whatever the core decided in the same step (vLLM does too).
                    stopped_by_string = not output.finished
                    self.finish_reason, self.stop_reason = "stop", match.stop_string
        if self.finish_reason is None and output.finished:
            self.finish_reason, self.stop_reason = output.finish_reason, output.stop_reason
            self.status_message = output.status_message
        if self.finished and self.metrics.finished_time is None:
            self.metrics.finished_time = now
        return stopped_by_string

    def _update_token_by_token(self, output: EngineCoreOutput, now: float) -> bool:
        """Several tokens in one step (speculative decoding) for a request with stop strings: apply them one at
        a time, as steps of one token would, so that a stop string completed by an early one ends the request
        there and the tokens after it are not part of the output."""
        last = len(output.new_token_ids) - 1
        for index, token_id in enumerate(output.new_token_ids):
            final = index == last
            stopped = self.update(EngineCoreOutput(
                output.request_id, [token_id], output.finish_reason if final else None,
                output.stop_reason if final else None, output.num_cached_tokens,
                output.status_message if final else None,
                output.logprobs[index] if isinstance(output.logprobs, list) else None), now)
            if self.finished:
                # Ended by a stop string: the core must finish it too, unless it ended it in this step already.
                return stopped and not output.finished
        return False

    def make_request_output(self) -> RequestOutput | None:
        """The output to hand out now, or None (``final`` kind before the request finishes)."""
        finished = self.finished
        if self.output_kind == "final" and not finished:
            return None
        visible = len(self._text)
        params = self.sampling_params
        if not finished and params.stop and not params.include_stop_str_in_output:
            visible -= stop_string_hold_back(self._text, params.stop)
        if self.output_kind == "delta":
            text, token_ids = self._text[self._sent_chars:visible], self.output_token_ids[self._sent_tokens:]
            logprobs = self.logprobs.logprobs[self._sent_tokens:] if self.logprobs.logprobs is not None else None
            self._sent_chars, self._sent_tokens = max(visible, self._sent_chars), len(self.output_token_ids)
        else:
            text, token_ids, logprobs = self._text[:visible], list(self.output_token_ids), self.logprobs.logprobs
        completion = CompletionOutput(
            index=0, text=text, token_ids=token_ids, cumulative_logprob=self.logprobs.cumulative_logprob,
            logprobs=logprobs, finish_reason=self.finish_reason, stop_reason=self.stop_reason)
        return RequestOutput(
            request_id=self.request_id, prompt=self.prompt, prompt_token_ids=self.prompt_token_ids,
            prompt_logprobs=self.logprobs.prompt_logprobs, outputs=[completion], finished=finished,
            metrics=self.metrics, num_cached_tokens=self.num_cached_tokens, status_message=self.status_message)
