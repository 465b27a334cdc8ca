"""Tool-call parsers for ``tool_choice: "auto"``, registered by name (``--tool-call-parser NAME``).

A parser reads what the model wrote in its own tool-calling format and splits it into content and tool calls,
two ways: ``extract`` on a whole text (non-streaming responses), and ``streaming()``, an object fed the text a
delta at a time (streamed responses). A new format is one module defining a ``ToolParser`` subclass, registered
here with ``register``; ``parser_names()`` lists them for the CLI's error on an unknown name.
"""

from __future__ import annotations

from engine.named_registry import NamedRegistry
from engine.serve.tool_parsers.base import ExtractedToolCalls, ParsedToolCall, StreamingToolParser, ToolParser
from engine.serve.tool_parsers.glm45 import Glm45ToolParser
from engine.serve.tool_parsers.hermes import HermesToolParser
from engine.serve.tool_parsers.llama3_json import Llama3JsonToolParser
from engine.serve.tool_parsers.mistral import MistralToolParser
from engine.serve.tool_parsers.openai import OpenAIToolParser
from engine.serve.tool_parsers.pythonic import PythonicToolParser
from engine.serve.tool_parsers.qwen3_coder import Qwen3CoderToolParser
from engine.serve.tool_parsers.section_formats import DeepSeekV3ToolParser, DeepSeekV31ToolParser, KimiK2ToolParser

_PARSERS: NamedRegistry[type[ToolParser]] = NamedRegistry("tool-call parser")
register = _PARSERS.register
parser_names = _PARSERS.names


def get_parser(name: str) -> ToolParser:
    """A new parser of the format registered as ``name`` (one serves one request); a ValueError listing the known
    names otherwise."""
    return _PARSERS.get(name)()


register("deepseek_v3", DeepSeekV3ToolParser)
register("deepseek_v31", DeepSeekV31ToolParser)
register("glm45", Glm45ToolParser)
register("hermes", HermesToolParser)
register("kimi_k2", KimiK2ToolParser)
register("llama3_json", Llama3JsonToolParser)
register("mistral", MistralToolParser)
register("openai", OpenAIToolParser)
register("pythonic", PythonicToolParser)
register("qwen3_coder", Qwen3CoderToolParser)

__all__ = ["ExtractedToolCalls", "ParsedToolCall", "StreamingToolParser", "ToolParser", "get_parser",
           "parser_names", "register"]
