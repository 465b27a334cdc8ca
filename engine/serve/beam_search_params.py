"""vLLM's ``to_beam_search_params`` for both routes: ``use_beam_search`` with ``n`` the beam width,
``length_penalty``, ``ignore_eos``, ``include_stop_str_in_output``; ``max_tokens`` (on chat
``max_completion_tokens`` first) null is the rest of the context.

The search ranks whole sequences by the raw logprobs of greedy one-token rounds (engine/beam_search.py), so the
sampling knobs and the fields about tokens as they are made (logprobs, stop strings, structured outputs, tools)
would be ignored. vLLM lets them through; each, set to anything but its default, is a 400 naming
``use_beam_search`` here, as this server's other unhonoured fields are."""

from __future__ import annotations

import re

from engine.beam_search import BeamSearchParams
from engine.core import SamplingParams
from engine.serve.errors import OpenAIError

# The fields a beam search would not honour; each route checks those its request has.
_NOT_WITH_BEAM_SEARCH = ("echo", "logprobs", "top_logprobs", "prompt_logprobs", "stop", "stop_token_ids",
                         "min_tokens", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
                         "repetition_penalty", "logit_bias", "response_format", "guided_json", "guided_regex",
                         "guided_choice", "guided_grammar", "structured_outputs", "truncate_prompt_tokens",
                         "tools", "tool_choice")


def beam_search_params(request, params: SamplingParams, num_prompt_tokens: int,
                       max_model_len: int) -> BeamSearchParams:
    """The search for ``request`` (a completions or chat body with ``use_beam_search``); ``params`` (the route's
    sampling parameters) has checked the fields both share, and resolved ``max_tokens``."""
    fields = type(request).model_fields
    for name in _NOT_WITH_BEAM_SEARCH:
        value = getattr(request, name, None)
        if name in fields and value is not None and value != fields[name].default:
            raise OpenAIError(f"use_beam_search does not take {name} (beam search ranks whole sequences by "
                              f"their raw logprobs)", param="use_beam_search", code="invalid_value")
    max_tokens = params.max_tokens if params.max_tokens is not None else max_model_len - num_prompt_tokens
    try:
        return BeamSearchParams(beam_width=params.n, max_tokens=max_tokens, ignore_eos=request.ignore_eos,
                                temperature=0.0 if request.temperature is None else request.temperature,
                                length_penalty=request.length_penalty,
                                include_stop_str_in_output=request.include_stop_str_in_output)
    except ValueError as error:
        field = re.search(r"BeamSearchParams\.(\w+)", str(error)).group(1)
        param = {"beam_width": "n"}.get(field, field)
        raise OpenAIError(str(error).replace(f"BeamSearchParams.{field}", param), param=param,
                          code="invalid_value") from None
