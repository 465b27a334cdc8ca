"""Turning a user's prompt and sampling parameters into a core ``Request``, checked first.

Shared by ``LLM`` and ``AsyncLLM``. Everything that would otherwise fail inside a step (a token id
outside the vocabulary, a prompt longer than the engine can ever hold, logprobs beyond the vocabulary)
is rejected here with a ``ValueError`` that names the prompt (``label``, e.g. "prompt 3") and the
field, before anything reaches the engine: a bad request never leaves a trace in the scheduler.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from engine.core import LoRARequest, PoolingParams, Request, SamplingParams, Scheduler
from engine.core.multimodal import MultiModalFeature
from engine.core.scheduling_policy import reads_priority
from engine.multimodal_inputs import ImageInputs
from engine.runner.structured_output.manager import StructuredOutputs


@dataclasses.dataclass(slots=True)
class Prompt:
    text: str | None
    token_ids: list[int]
    # Its images (engine/multimodal_inputs.py): placeholder runs of token_ids, with their pixels.
    mm_features: tuple[MultiModalFeature, ...] = ()
    # vLLM's cache_salt: the prompt's prefix-cache hits come only from requests with the same salt (the core mixes
    # it into the first block's hash), so tenants sharing an engine cannot time each other's prompts. None: none.
    cache_salt: str | None = None


def is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_prompt(label: str, prompt: Any, tokenizer, vocab_size: int, images: ImageInputs | None = None) -> Prompt:
    """A string, a token-id list, or a dict with ``prompt_token_ids`` and/or ``prompt`` (text), and optionally
    ``multi_modal_data`` (``{"image": image or [images]}``, where ``images`` is the engine's image processing;
    None: the model takes text only) and ``cache_salt`` (a non-empty string)."""
    if isinstance(prompt, dict):
        text = prompt.get("prompt")
        token_ids = prompt.get("prompt_token_ids")
        if token_ids is None and text is None:
            raise ValueError(f"{label}: a dict prompt needs 'prompt_token_ids' or 'prompt', "
                             f"got keys {sorted(prompt)}")
        cache_salt = prompt.get("cache_salt")
        if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
            raise ValueError(f"{label}: cache_salt must be a non-empty string, got {cache_salt!r}")
        parsed = parse_prompt(label, text, tokenizer, vocab_size) if token_ids is None else \
            Prompt(text, check_token_ids(label, token_ids, vocab_size))
        parsed.cache_salt = cache_salt
        multi_modal_data = prompt.get("multi_modal_data")
        if multi_modal_data is None:
            return parsed
        if images is None:
            raise ValueError(f"{label}: multi_modal_data needs a vision-language model whose images this engine "
                             "encodes (Gemma 3, InternVL, LLaVA, LLaVA-NeXT, LLaVA-OneVision, Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Mistral 3, with their "
                             "preprocessor_config.json); this engine takes text only")
        token_ids, features = images.process(label, parsed.token_ids, multi_modal_data)
        return Prompt(text, token_ids, features, cache_salt)
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError(f"{label} is text but the engine has no tokenizer "
                             "(skip_tokenizer_init=True); pass token ids")
        return Prompt(prompt, list(tokenizer(prompt).input_ids) if prompt else [])
    if isinstance(prompt, (list, tuple)):
        return Prompt(None, check_token_ids(label, prompt, vocab_size))
    raise ValueError(f"{label} must be a string, a list of token ids or a dict, got {type(prompt).__name__}")


def refuse_images_in_beam_search(label: str, prompt: Prompt) -> None:
    """Beam search runs each beam as a token-id prompt (engine/beam_search.py), which would drop the images, and the
    salt (whose requests would then share the prefix cache with everyone's)."""
    if prompt.mm_features:
        raise ValueError(f"{label}: beam search does not take multi_modal_data (images); use generate")
    if prompt.cache_salt is not None:
        raise ValueError(f"{label}: beam search does not take cache_salt; use generate")


def check_token_ids(label: str, token_ids: Sequence[Any], vocab_size: int) -> list[int]:
    bad = [t for t in token_ids if not is_token_id(t) or not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"{label} has token id(s) {bad[:5]} outside the vocabulary [0, {vocab_size})")
    return [int(t) for t in token_ids]


def truncate_prompt(label: str, prompt: Prompt, params: SamplingParams, max_model_len: int) -> Prompt:
    """The prompt's last ``params.truncate_prompt_tokens`` tokens (vLLM's left truncation; -1 keeps as many
    as the engine allows, ``max_model_len``), or the prompt itself when it is no longer. A cut prompt has no
    text: what is echoed or reported is what the model saw, the kept tokens. A count above ``max_model_len``
    is refused, as vLLM refuses it, since no prompt that long could be served anyway."""
    keep = params.truncate_prompt_tokens
    if keep is None:
        return prompt
    if keep == -1:
        keep = max_model_len
    if keep > max_model_len:
        raise ValueError(f"{label}: SamplingParams.truncate_prompt_tokens must be -1 or at most max_model_len "
                         f"({max_model_len}), got {keep}; select a smaller truncation size")
    if len(prompt.token_ids) <= keep:
        return prompt
    if prompt.mm_features:
        raise ValueError(f"{label}: SamplingParams.truncate_prompt_tokens={keep} would cut a prompt with images "
                         f"({len(prompt.token_ids)} tokens with their placeholders); send a shorter prompt")
    return Prompt(None, prompt.token_ids[-keep:])


def validate_request(label: str, prompt: Prompt, params: SamplingParams, scheduler: Scheduler, vocab_size: int,
                     has_tokenizer: bool, structured_outputs: StructuredOutputs | None = None,
                     lora_request: LoRARequest | None = None, lora=None) -> None:
    """Everything that would otherwise fail inside a step, checked while nothing is added yet.

    Reads only the scheduler's configuration (fixed after construction), so any thread may call it. A request
    with structured outputs has its grammar compiled here (``structured_outputs``: the engine's grammars), so a
    schema, regex or grammar that does not compile is refused before the scheduler sees the request. A request
    with a LoRA adapter has it read and checked into the runner's host cache here (``lora``: the runner's
    LoRAManager, None without enable_lora), for the same reason.
    """
    num_tokens = len(prompt.token_ids)
    if num_tokens == 0:
        raise ValueError(f"{label} is empty (0 tokens); every prompt needs at least one token")
    limit = scheduler.max_model_len
    if num_tokens > limit:
        config = scheduler.scheduler_config
        # Name every bound that makes up the limit, or a message citing only max_model_len contradicts itself
        # when the per-step budget (without chunked prefill) is what lowered it.
        budget = ("" if config.enable_chunked_prefill else
                  f", max_num_batched_tokens={config.max_num_batched_tokens} without chunked prefill")
        raise ValueError(f"{label} has {num_tokens} tokens, more than the engine allows: {limit} "
                         f"(max_model_len={config.max_model_len}, KV capacity "
                         f"{scheduler.cache_config.capacity_tokens} tokens{budget})")
    for name in ("logprobs", "prompt_logprobs"):
        value = getattr(params, name)
        if value is not None and value > vocab_size:
            raise ValueError(f"{label}: SamplingParams.{name} must be <= the vocabulary size "
                             f"{vocab_size}, got {value}")
    for name, ids in (("allowed_token_ids", params.allowed_token_ids or []),
                      ("logit_bias", list(params.logit_bias or {})),
                      ("stop_token_ids", params.stop_token_ids)):
        bad = [t for t in ids if t >= vocab_size]
        if bad:
            raise ValueError(f"{label}: SamplingParams.{name} has token id(s) {bad[:5]} outside "
                             f"the vocabulary [0, {vocab_size})")
    if not has_tokenizer:
        for name in ("bad_words", "stop"):
            if getattr(params, name):
                raise ValueError(f"{label}: SamplingParams.{name} needs a tokenizer (the engine was "
                                 "created with skip_tokenizer_init=True)")
    if params.structured_outputs is not None:
        check_structured_outputs(label, params, structured_outputs)
    if lora_request is not None:
        check_lora_request(label, lora_request, lora)


def check_lora_request(label: str, lora_request: LoRARequest, lora) -> None:
    """The adapter loads and fits the model (``lora``: the runner's LoRAManager), or a ValueError naming it."""
    if not isinstance(lora_request, LoRARequest):
        raise ValueError(f"{label}: lora_request must be a LoRARequest, got {type(lora_request).__name__}")
    if lora is None:
        raise ValueError(f"{label}: lora_request {lora_request.lora_name!r} needs an engine created with "
                         "enable_lora=True")
    try:
        lora.add_lora(lora_request)
    except ValueError as error:
        raise ValueError(f"{label}: lora_request {lora_request.lora_name!r}: {error}") from None


def check_structured_outputs(label: str, params: SamplingParams,
                             structured_outputs: StructuredOutputs | None) -> None:
    if structured_outputs is None:
        raise ValueError(f"{label}: SamplingParams.structured_outputs needs the engine's grammars; none were "
                         "passed to validate_request")
    try:
        structured_outputs.check(params.structured_outputs)
    except ValueError as error:
        raise ValueError(f"{label}: {error}") from None


def check_priority(priority: object, policy: str, label: str = "priority") -> int:
    """A request's priority (lower is served first, as in vLLM): an integer, and only where the scheduler
    may use it; under fcfs (or another named policy that ranks by something else) a priority would be silently
    ignored, so it is refused, as vLLM refuses it under fcfs."""
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise ValueError(f"{label} must be an integer (lower is served first), got {priority!r}")
    if priority != 0 and not reads_priority(policy):
        raise ValueError(f"{label} {priority} needs scheduling_policy='priority'; the engine schedules {policy!r}")
    return priority


def make_core_request(request_id: str, prompt: Prompt, params: SamplingParams, eos_token_ids: list[int],
                      arrival_time: float, priority: int = 0, lora_request: LoRARequest | None = None,
                      pooling_params: PoolingParams | None = None) -> Request:
    """The core's Request; its ``sampling_params`` carry the extra EOS ids (hand those to the output
    processor too, so both sides agree on what stops the request)."""
    eos_token_id = eos_token_ids[0] if eos_token_ids else None
    extra_eos = [t for t in eos_token_ids[1:] if t not in params.stop_token_ids]
    if extra_eos and not params.ignore_eos:
        # A checkpoint with several EOS ids (Llama 3): the core checks one, the rest stop like stop tokens.
        seed = params.seed  # a derived seed of -1 must survive construction (see SamplingParams' seed)
        params = dataclasses.replace(params, stop_token_ids=list(params.stop_token_ids) + extra_eos)
        params.seed = seed
    return Request(request_id, prompt.token_ids, params, eos_token_id=eos_token_id, arrival_time=arrival_time,
                   priority=priority, lora_request=lora_request, pooling_params=pooling_params,
                   mm_features=prompt.mm_features, cache_salt=prompt.cache_salt)
