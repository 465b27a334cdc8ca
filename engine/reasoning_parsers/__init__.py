"""Reasoning parsers (vLLM's ``--reasoning-parser NAME``): a chat answer's reasoning split from its content.

A reasoning model writes its chain of thought before the answer, between ``<think>`` and ``</think>``; with a parser
the server returns the thought as the message's ``reasoning`` (a streamed delta's too) and the rest as its
``content``, which the tool-call parser then reads. ``deepseek_r1``: the model starts thinking at once (its template
opens the thought; a ``<think>`` it writes anyway is dropped), so everything before ``</think>`` is reasoning, all of
it when the answer is cut before the tag. ``qwen3``: reasoning only when the answer opens with ``<think>`` (Qwen3 with
``enable_thinking`` off writes none: all content); ``glm45`` (GLM-4.5) the same. ``deepseek_v3`` (DeepSeek-V3.1):
``deepseek_r1``'s rule for a request whose ``chat_template_kwargs`` turn ``thinking`` on, all content otherwise.
``mistral`` (Magistral: ``[THINK]`` ... ``[/THINK]``, special tokens kept in the text for it), ``seed_oss``
(``<seed:think>`` ... ``</seed:think>``) and ``ernie45`` (ERNIE 4.5's thinking models) as ``qwen3``, with their tags.
``openai_gptoss`` (gpt-oss): its harmony messages, the ``analysis`` channel as reasoning, ``final`` and preambles as
content, calls passed on to the ``openai`` tool-call parser (harmony.py). Registered by name as the tool-call parsers
are.
"""

from __future__ import annotations

from engine.named_registry import NamedRegistry
from engine.reasoning_parsers.harmony import HarmonyReasoningParser, StreamingHarmonyReasoning
from engine.reasoning_parsers.think_tags import StreamingReasoningParser, ThinkTagsParser

# What a parser is: ``for_request``, ``extract``, ``streaming`` (feed and finish giving (reasoning, content)),
# ``start_tag`` and ``end_tag`` (for structured outputs) and ``keeps_special_tokens``.
ReasoningParser = ThinkTagsParser | HarmonyReasoningParser

_PARSERS: NamedRegistry[ReasoningParser] = NamedRegistry("reasoning parser")
register = _PARSERS.register
parser_names = _PARSERS.names
get_parser = _PARSERS.get  # a ValueError listing the known names for an unknown one


register("deepseek_r1", ThinkTagsParser(thinks_at_once=True))
register("qwen3", ThinkTagsParser(thinks_at_once=False))
register("glm45", ThinkTagsParser(thinks_at_once=False))
register("deepseek_v3", ThinkTagsParser(thinks_at_once=True, thinking_switch="thinking"))
register("openai_gptoss", HarmonyReasoningParser())
# Magistral (Mistral's reasoning models): [THINK] ... [/THINK], special tokens in its tokenizer.
register("mistral", ThinkTagsParser(thinks_at_once=False, start_tag="[THINK]", end_tag="[/THINK]",
                                    keeps_special_tokens=True))
register("seed_oss", ThinkTagsParser(thinks_at_once=False, start_tag="<seed:think>", end_tag="</seed:think>"))
register("ernie45", ThinkTagsParser(thinks_at_once=False))

__all__ = ["ReasoningParser", "StreamingHarmonyReasoning", "StreamingReasoningParser", "get_parser", "parser_names",
           "register"]
