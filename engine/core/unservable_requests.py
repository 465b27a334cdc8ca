"""Why a request could never be served: it is then finished as IGNORED at once, with this reason for the user.

A request that could never make progress would otherwise wait forever (or preempt itself forever), holding up
the queue behind it; the reason names the limit and its value.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.core.request import Request

if TYPE_CHECKING:
    from engine.core.scheduler import Scheduler


def why_unservable(scheduler: Scheduler, request: Request) -> str | None:
    num_prompt_tokens = request.num_prompt_tokens
    if num_prompt_tokens == 0:
        return "the prompt is empty"
    if num_prompt_tokens > scheduler.scheduler_config.max_model_len:
        return (f"prompt length {num_prompt_tokens} exceeds max_model_len "
                f"{scheduler.scheduler_config.max_model_len}")
    if num_prompt_tokens > scheduler.cache_config.capacity_tokens:
        return (f"prompt length {num_prompt_tokens} exceeds the KV cache capacity "
                f"({scheduler.cache_config.num_usable_blocks} blocks x {scheduler.block_size} tokens)")
    groups = scheduler.cache_config.kv_cache_groups
    if groups is not None and num_prompt_tokens > scheduler.max_model_len and scheduler.scheduler_config.enable_chunked_prefill:
        return (f"prompt length {num_prompt_tokens} exceeds what the KV cache holds across its {len(groups)} "
                f"groups ({scheduler.max_model_len} tokens in {scheduler.cache_config.num_usable_blocks} blocks x "
                f"{scheduler.block_size} tokens)")
    if num_prompt_tokens > scheduler.max_model_len:
        return (f"prompt length {num_prompt_tokens} exceeds max_num_batched_tokens "
                f"{scheduler.max_num_batched_tokens} and chunked prefill is disabled")
    if request.mm_features:
        return _why_items_unservable(scheduler, request)
    return None


def _why_items_unservable(scheduler: Scheduler, request: Request) -> str | None:
    """An item whose encoder output could never be computed, or (without chunked items) never prefilled in
    one step, would leave its request waiting forever."""
    longest = max(request.mm_features, key=lambda feature: feature.length)
    limits = [("max_num_encoder_input_tokens", scheduler.encoder_compute_budget),
              ("encoder_cache_size", scheduler.encoder_cache_manager.cache_size)]
    if scheduler.disable_chunked_mm_input:
        limits.append(("max_num_batched_tokens", scheduler.max_num_batched_tokens))
        if scheduler.long_prefill_token_threshold:
            limits.append(("long_prefill_token_threshold", scheduler.long_prefill_token_threshold))
    for name, limit in limits:
        if longest.length > limit:
            return (f"multimodal item {longest.identifier!r} has {longest.length} tokens, more than "
                    f"{name} {limit}" + (" with disable_chunked_mm_input" if name in (
                        "max_num_batched_tokens", "long_prefill_token_threshold") else ""))
    if not scheduler.enable_chunked_prefill:
        # The whole prompt is prefilled in one step, so all its distinct items are encoded in that step.
        total = sum({feature.identifier: feature.length for feature in request.mm_features}.values())
        for name, limit in limits[:2]:
            if total > limit:
                return (f"the prompt's multimodal items have {total} encoder tokens, more than {name} {limit}, "
                        "and chunked prefill is disabled")
    return None
