"""Structured outputs (vLLM's guided decoding): a request's output constrained to a JSON schema, a regular
expression, one of a list of strings or an EBNF grammar, enforced with xgrammar.

- ``grammar_specs.py``: which grammar each kind of ``StructuredOutputsParams`` compiles from (pure Python).
- ``xgrammar_backend.py``: the tokenizer's vocabulary for xgrammar, the cached compiler, matchers, bitmasks;
  the only module that imports xgrammar, and only when a request asks for structured outputs.
- ``manager.py``: ``StructuredOutputs``, shared by the front end (compile to check, when a request is added)
  and the runner (one matcher per request).
- ``request_grammar.py``: a request's matcher kept consistent with the scheduler's tokens.
- ``logits_mask.py``: the step's bitmask over the constrained rows' logits.

The parameters themselves live in the core (``engine/core/structured_outputs.py``), which stays free of
xgrammar and torch.
"""

from engine.runner.structured_output.manager import StructuredOutputs
from engine.runner.structured_output.request_grammar import RequestGrammar

__all__ = ["RequestGrammar", "StructuredOutputs"]
