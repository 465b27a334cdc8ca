"""``StructuredOutputs``: the engine's one entry point to grammars, shared by the front end and the runner.

- The front end calls ``check`` while it validates a request, before anything is added: a schema, regex or
  grammar that does not compile is a ValueError naming the field there (a 400 from the server), never a
  failure inside an engine step. The grammar compiled for the check stays in the compiler's cache.
- The runner calls ``new_request_grammar`` when the request first reaches it (a cache hit) and keeps the
  matcher in the request's state.

The xgrammar backend is created on the first structured request, so engines that never see one neither
import xgrammar (a few seconds) nor need it installed; without it, such a request gets a ValueError that
names the extra to install.
"""

from __future__ import annotations

import threading

from engine.core.structured_outputs import StructuredOutputsParams
from engine.optional_dependencies import missing_extra_message
from engine.runner.structured_output.request_grammar import RequestGrammar

class StructuredOutputs:
    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: list[int],
                 reasoning_tags: tuple[list[int], list[int]] | None = None) -> None:
        """``tokenizer`` must be one no other thread uses while the first structured request is checked (the
        backend reads its vocabulary then); ``vocab_size`` is the model's (its logits' width); the stop tokens
        are the engine's EOS ids. ``reasoning_tags``: a reasoning model's (start, end) tag token ids, whose
        grammars steer only the answer after the thought (None: the whole output)."""
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = list(stop_token_ids)
        self.reasoning_tags = reasoning_tags
        self._backend = None
        self._backend_lock = threading.Lock()

    @property
    def backend(self):
        """The xgrammar backend, created on first use (ValueError when xgrammar is not installed)."""
        if self._backend is None:
            with self._backend_lock:
                if self._backend is None:
                    self._backend = self._create_backend()
        return self._backend

    def _create_backend(self):
        if self._tokenizer is None:
            raise ValueError("SamplingParams.structured_outputs needs a tokenizer (the engine was created with "
                             "skip_tokenizer_init=True): grammars are written in text")
        try:
            from engine.runner.structured_output.xgrammar_backend import XgrammarBackend
        except ModuleNotFoundError as error:
            message = missing_extra_message(error, "structured outputs")
            if message is None:
                raise
            raise ValueError(f"SamplingParams.structured_outputs: {message}") from None
        return XgrammarBackend(self._tokenizer, self.vocab_size, self.stop_token_ids)

    def check(self, params: StructuredOutputsParams) -> None:
        """Compile the request's grammar (ValueError naming the field when it does not compile)."""
        self.backend.compile(params)

    def new_request_grammar(self, req_id: str, params: StructuredOutputsParams,
                            prompt_token_ids: list[int] = ()) -> RequestGrammar:
        backend = self.backend
        thinking = self.reasoning_tags is not None and not thought_ended(prompt_token_ids, *self.reasoning_tags)
        return RequestGrammar(req_id, backend.new_matcher(backend.compile(params)),
                              self.reasoning_tags[1] if thinking else None)


def thought_ended(prompt_token_ids: list[int], start: list[int], end: list[int]) -> bool:
    """Whether the prompt closes its last thought itself (Qwen3's template with enable_thinking off writes an
    empty one): the end tag after the prompt's last start tag (vLLM asks the same of the prompt)."""
    tokens = list(prompt_token_ids)
    last_start = max((index + len(start) for index in range(len(tokens) - len(start) + 1)
                      if tokens[index:index + len(start)] == start), default=0)
    tail = tokens[last_start:]
    return any(tail[index:index + len(end)] == end for index in range(len(tail) - len(end) + 1))
