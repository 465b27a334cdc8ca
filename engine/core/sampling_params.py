"""Sampling parameters, with vLLM's public field names and meanings.

``n`` (parallel sampling) is the front end's business: it fans a request out into ``n`` core requests
with ``n = 1`` (engine/parallel_sampling.py), so the core itself only ever sees ``n = 1``.

Validation happens once, at construction: every invalid value raises ``ValueError`` naming the
field and the value, so a bad request is rejected before it reaches the scheduler.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from engine.core.structured_outputs import StructuredOutputsParams

# Below this temperature sampling is greedy (vLLM uses the same threshold). After the raise to
# MIN_RANDOM_TEMPERATURE below, only a temperature of exactly 0 is.
GREEDY_TEMPERATURE_EPSILON = 1e-5

# vLLM raises any positive temperature below this to it (logging that tinier ones risk inf/NaN), so
# there temperature=1e-6 samples at 0.01 rather than greedily, and 0.005 samples at 0.01, not 0.005.
# Users compare the two engines on the same requests, so SamplingParams raises it the same way.
MIN_RANDOM_TEMPERATURE = 1e-2

# The seeds torch.Generator.manual_seed accepts (it unpacks a signed 64-bit value, or an unsigned one
# for non-negative seeds); one outside this range would raise inside an engine step, failing every
# request in that step. torch is not imported here (the core is pure Python), so the range is spelled out.
MIN_SEED = -(2**63)
MAX_SEED = 2**64 - 1

# The most completions one request may ask for: vLLM's VLLM_MAX_N_SEQUENCES default. The front end builds
# every child's parameters and state when the request arrives, so n=10**9 from a client held the server's
# event loop and its memory (tens of GB) until the process was killed; vLLM added the ceiling for that reason.
MAX_N = 16384

# A bias of 100 already makes a token certain or impossible (e**100 dwarfs any softmax mass), and
# OpenAI's API allows [-100, 100]. The LLM API documents nothing larger, and larger finite values gain
# nothing: past the logits' dtype range (65504 in float16) they overflow to inf, and inf - inf is NaN,
# which sampling turns into an arbitrary token. So SamplingParams holds to OpenAI's range too.
MAX_ABS_LOGIT_BIAS = 100.0


class SamplingType(enum.IntEnum):
    GREEDY = 0
    RANDOM = 1
    RANDOM_SEED = 2


def _field_error(name: str, value: object, requirement: str) -> ValueError:
    return ValueError(f"SamplingParams.{name} must be {requirement}, got {value!r}")


@dataclass
class SamplingParams:
    n: int = 1
    max_tokens: int | None = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 (or -1) disables top-k
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    # Constrain the output to a JSON schema, regex, choice or grammar (engine/runner/structured_output/ enforces it).
    structured_outputs: StructuredOutputsParams | None = None
    # Keep only the prompt's last k tokens (-1: as many as the engine allows), as vLLM's field does. The front
    # end cuts the prompt before the request is made (engine/request_inputs.py); the core never sees the cut.
    truncate_prompt_tokens: int | None = None
    # Derived once in __post_init__: the stop token ids as a frozenset for O(1) checks per token.
    all_stop_token_ids: frozenset[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._normalize()
        self._validate()
        if 0.0 < self.temperature < MIN_RANDOM_TEMPERATURE:
            self.temperature = MIN_RANDOM_TEMPERATURE
        if self.temperature < GREEDY_TEMPERATURE_EPSILON:
            # Greedy sampling ignores the truncation knobs; resetting them keeps the sampler's
            # greedy fast path free of per-request special cases.
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0
        self.all_stop_token_ids = frozenset(self.stop_token_ids)

    def _normalize(self) -> None:
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        else:
            self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k == -1:
            self.top_k = 0
        if self.seed == -1:
            # vLLM's convention (and many clients'): -1 asks for an unseeded request, not for torch's
            # seed -1; read literally, every such request repeated the same output. Code that derives a
            # seed (a parallel-sampling child's seed + i may be -1) sets it after construction instead.
            self.seed = None
        if self.logit_bias is not None:
            try:
                self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()}
            except (TypeError, ValueError, AttributeError) as error:
                raise _field_error("logit_bias", self.logit_bias, "a mapping of token id to float") from error

    def _validate(self) -> None:
        def check(name: str, ok: bool, requirement: str) -> None:
            if not ok:
                raise _field_error(name, getattr(self, name), requirement)

        def is_int(value: object) -> bool:
            return isinstance(value, int) and not isinstance(value, bool)

        check("n", is_int(self.n) and 1 <= self.n <= MAX_N, f"an integer in [1, {MAX_N}]")
        check("max_tokens", self.max_tokens is None or (is_int(self.max_tokens) and self.max_tokens >= 1),
              "an integer >= 1 or None")
        check("min_tokens", is_int(self.min_tokens) and self.min_tokens >= 0, "an integer >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"SamplingParams.min_tokens must be <= max_tokens ({self.max_tokens}), got {self.min_tokens!r}")
        check("temperature", _is_number(self.temperature) and self.temperature >= 0.0, "a number >= 0")
        check("top_p", _is_number(self.top_p) and 0.0 < self.top_p <= 1.0, "in (0, 1]")
        check("top_k", is_int(self.top_k) and self.top_k >= 0, "-1, 0 (disabled) or a positive integer")
        check("min_p", _is_number(self.min_p) and 0.0 <= self.min_p <= 1.0, "in [0, 1]")
        check("seed", self.seed is None or (is_int(self.seed) and MIN_SEED <= self.seed <= MAX_SEED),
              f"None or an integer in [{MIN_SEED}, {MAX_SEED}] (what torch's Generator.manual_seed accepts)")
        if self.seed is not None and self.n > 1 and self.seed + self.n - 1 > MAX_SEED:
            # Completion i samples with seed + i (engine/parallel_sampling.py): the last must still be a seed.
            raise ValueError(f"SamplingParams.seed must be <= {MAX_SEED - self.n + 1} with n={self.n} "
                             f"(completion i uses seed + i), got {self.seed!r}")
        check("stop", all(isinstance(s, str) and s for s in self.stop), "a non-empty string or a list of them")
        check("stop_token_ids", all(is_int(t) and t >= 0 for t in self.stop_token_ids),
              "a list of non-negative integers")
        check("ignore_eos", isinstance(self.ignore_eos, bool), "a boolean")
        check("presence_penalty", _is_number(self.presence_penalty) and -2.0 <= self.presence_penalty <= 2.0,
              "in [-2, 2]")
        check("frequency_penalty", _is_number(self.frequency_penalty) and -2.0 <= self.frequency_penalty <= 2.0,
              "in [-2, 2]")
        check("repetition_penalty", _is_number(self.repetition_penalty) and self.repetition_penalty > 0.0,
              "a number > 0")
        check("logit_bias", self.logit_bias is None or all(t >= 0 for t in self.logit_bias),
              "a mapping with non-negative token ids")
        if self.logit_bias is not None:
            for token_id, bias in self.logit_bias.items():
                if not (math.isfinite(bias) and abs(bias) <= MAX_ABS_LOGIT_BIAS):
                    raise ValueError(f"SamplingParams.logit_bias values must be finite numbers in "
                                     f"[-{MAX_ABS_LOGIT_BIAS:g}, {MAX_ABS_LOGIT_BIAS:g}], got {bias!r} "
                                     f"for token id {token_id}")
        check("allowed_token_ids", self.allowed_token_ids is None
              or (len(self.allowed_token_ids) > 0 and all(is_int(t) and t >= 0 for t in self.allowed_token_ids)),
              "None or a non-empty list of non-negative integers")
        check("bad_words", self.bad_words is None or all(isinstance(w, str) and w for w in self.bad_words),
              "None or a list of non-empty strings")
        check("logprobs", self.logprobs is None or (is_int(self.logprobs) and self.logprobs >= 0),
              "None or an integer >= 0")
        check("prompt_logprobs", self.prompt_logprobs is None or (is_int(self.prompt_logprobs)
                                                                  and self.prompt_logprobs >= 0),
              "None or an integer >= 0")
        check("truncate_prompt_tokens", self.truncate_prompt_tokens is None or (
            is_int(self.truncate_prompt_tokens) and (self.truncate_prompt_tokens >= 1
                                                     or self.truncate_prompt_tokens == -1)),
              "None, -1 (the longest prompt the engine allows) or an integer >= 1")
        check("include_stop_str_in_output", isinstance(self.include_stop_str_in_output, bool), "a boolean")
        check("structured_outputs", self.structured_outputs is None
              or isinstance(self.structured_outputs, StructuredOutputsParams), "None or a StructuredOutputsParams")

    @property
    def sampling_type(self) -> SamplingType:
        if self.temperature < GREEDY_TEMPERATURE_EPSILON:
            return SamplingType.GREEDY
        if self.seed is not None:
            return SamplingType.RANDOM_SEED
        return SamplingType.RANDOM

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE_EPSILON


def _is_number(value: object) -> bool:
    """A finite int or float: NaN and infinity pass a bare ``> 0`` check (repetition_penalty=inf did) and
    then turn logits into NaN, which sampling maps to an arbitrary token."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
