"""Beam search, as vLLM V1 does it: in the front end, on top of ordinary one-token generation.

Each round, every live beam is one request for ONE token with ``logprobs = 2 * beam_width``; the engine's
logprobs are the raw model's (log-softmax of the unprocessed logits, engine/runner/sampler/sampler.py),
so ``temperature`` cannot change them and is accepted for vLLM's API only. The prefix cache makes each
round's prompt (the beam's whole sequence) cost one new token. Candidates are every beam extended by each
of its top tokens, with the cumulative logprob summed; one ending in EOS (unless ``ignore_eos``) joins the
finished list, the best ``beam_width`` of the rest by score live on. After ``max_tokens`` rounds (or when
no beam is left), finished and live beams are ranked by ``beam_search_score`` and the best ``beam_width``
returned.

Ties keep candidate order (Python's sort is stable): beams in order, each beam's tokens by rank.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from engine.core import SamplingParams
from engine.outputs import Logprob, RequestOutput


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class BeamSearchParams:
    """vLLM's ``BeamSearchParams``, validated at construction (ValueError naming the field)."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        checks = [("beam_width", _is_int(self.beam_width) and self.beam_width >= 1, "an integer >= 1"),
                  ("max_tokens", _is_int(self.max_tokens) and self.max_tokens >= 1, "an integer >= 1"),
                  ("ignore_eos", isinstance(self.ignore_eos, bool), "a boolean"),
                  ("temperature", _is_number(self.temperature) and self.temperature >= 0.0, "a number >= 0"),
                  ("length_penalty", _is_number(self.length_penalty), "a finite number"),
                  ("include_stop_str_in_output", isinstance(self.include_stop_str_in_output, bool), "a boolean")]
        for name, ok, requirement in checks:
            if not ok:
                raise ValueError(f"BeamSearchParams.{name} must be {requirement}, got {getattr(self, name)!r}")

    def round_sampling_params(self) -> SamplingParams:
        """One round's request: one token, the top ``2 * beam_width`` logprobs. Greedy and ignoring EOS:
        the sampled token is not used, and EOS is this module's business, not the engine's."""
        return SamplingParams(max_tokens=1, temperature=0.0, logprobs=2 * self.beam_width, ignore_eos=True,
                              skip_special_tokens=False)


@dataclass
class BeamSearchSequence:
    """One beam. As in vLLM, ``tokens`` holds the prompt then the generated tokens (with the EOS that
    finished it, if one did); ``logprobs`` one dict per generated token. ``text`` (filled on return) is
    the generated text only, EOS left out unless ``include_stop_str_in_output``."""

    tokens: list[int]
    logprobs: list[dict[int, Logprob]]
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None  # "stop" (EOS) or "length"
    stop_reason: int | str | None = None
    num_prompt_tokens: int = field(default=0, repr=False)

    @property
    def output_token_ids(self) -> list[int]:
        return self.tokens[self.num_prompt_tokens:]


@dataclass
class BeamSearchOutput:
    sequences: list[BeamSearchSequence]


def beam_search_score(tokens: Sequence[int], cum_logprob: float, eos_token_ids: Sequence[int],
                      length_penalty: float = 1.0) -> float:
    """vLLM's ``get_beam_search_score`` (from transformers'): the cumulative logprob over the length to the
    power ``length_penalty``, where the length is the whole sequence, prompt included, less a final EOS."""
    length = len(tokens)
    if tokens and tokens[-1] in eos_token_ids:
        length -= 1
    return cum_logprob / (max(length, 1) ** length_penalty)


class BeamSearchInstance:
    """One prompt's search state: ``beams`` (live) and ``completed``."""

    def __init__(self, prompt_token_ids: list[int], params: BeamSearchParams, eos_token_ids: Sequence[int]) -> None:
        self.params = params
        self.eos_token_ids = frozenset(eos_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.beams = [BeamSearchSequence(list(prompt_token_ids), [], num_prompt_tokens=self.num_prompt_tokens)]
        self.completed: list[BeamSearchSequence] = []

    def _score(self, beam: BeamSearchSequence) -> float:
        return beam_search_score(beam.tokens, beam.cum_logprob, self.eos_token_ids, self.params.length_penalty)

    def advance(self, outputs: Sequence[RequestOutput]) -> None:
        """Extend every live beam by the round's output for it (one per beam, in order)."""
        candidates: list[BeamSearchSequence] = []
        for beam, output in zip(self.beams, outputs, strict=True):
            top = output.outputs[0].logprobs[0]
            for token_id, logprob in sorted(top.items(), key=lambda item: -item[1].logprob):
                candidate = BeamSearchSequence(beam.tokens + [token_id], beam.logprobs + [top],
                                               beam.cum_logprob + logprob.logprob,
                                               num_prompt_tokens=self.num_prompt_tokens)
                if token_id in self.eos_token_ids and not self.params.ignore_eos:
                    candidate.finish_reason = "stop"
                    self.completed.append(candidate)
                else:
                    candidates.append(candidate)
        candidates.sort(key=self._score, reverse=True)
        self.beams = candidates[:self.params.beam_width]

    def result(self, decode: Callable[[list[int]], str] | None) -> BeamSearchOutput:
        for beam in self.beams:
            beam.finish_reason = "length"
        best = sorted(self.completed + self.beams, key=self._score, reverse=True)[:self.params.beam_width]
        for beam in best:
            output_ids = beam.output_token_ids
            if beam.finish_reason == "stop" and not self.params.include_stop_str_in_output:
                output_ids = output_ids[:-1]
            beam.text = decode(output_ids) if decode is not None else None
        return BeamSearchOutput(best)


class BeamSearch:
    """The search over several prompts at once, as rounds: ``next_round`` gives every live beam's sequence (token
    ids; empty once the search is over), ``advance`` takes the round's outputs in the same order. The driver,
    sync (``LLM.beam_search``) or async (``AsyncLLM.beam_search``), only runs the requests."""

    def __init__(self, prompt_token_ids: Sequence[list[int]], params: BeamSearchParams,
                 eos_token_ids: Sequence[int]) -> None:
        self.params = params
        self.round_params = params.round_sampling_params()
        self.instances = [BeamSearchInstance(ids, params, eos_token_ids) for ids in prompt_token_ids]
        self.num_rounds = 0

    def next_round(self) -> list[list[int]]:
        if self.num_rounds >= self.params.max_tokens:
            return []
        return [beam.tokens for instance in self.instances for beam in instance.beams]

    def advance(self, outputs: Sequence[RequestOutput]) -> None:
        start = 0
        for instance in self.instances:
            end = start + len(instance.beams)
            if end > start:
                instance.advance(outputs[start:end])
            start = end
        self.num_rounds += 1

    def results(self, decode: Callable[[list[int]], str] | None) -> list[BeamSearchOutput]:
        return [instance.result(decode) for instance in self.instances]


def run_beam_search(prompt_token_ids: Sequence[list[int]], params: BeamSearchParams, eos_token_ids: Sequence[int],
                    generate_round: Callable[[list[list[int]], SamplingParams], list[RequestOutput]],
                    decode: Callable[[list[int]], str] | None) -> list[BeamSearchOutput]:
    """Each round is one ``generate_round`` call for all live beams of every prompt."""
    search = BeamSearch(prompt_token_ids, params, eos_token_ids)
    while sequences := search.next_round():
        search.advance(generate_round(sequences, search.round_params))
    return search.results(decode)
