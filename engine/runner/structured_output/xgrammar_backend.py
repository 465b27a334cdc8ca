"""The xgrammar backend: the model's vocabulary as xgrammar sees it, one cached compiler, and matchers.

Imported only when a request asks for structured outputs (``StructuredOutputs`` imports it lazily), so
an engine without the ``structured`` extra runs everything else unchanged.

Vocabulary: ``TokenizerInfo`` is built with the model's vocabulary size from its config, which may exceed
the tokenizer's (checkpoints pad the embedding to a multiple of 64 or 128). The rows past the tokenizer's
last token get a logit anyway, and xgrammar's masks forbid them; built with the tokenizer's size instead,
the bitmask would be too short and those rows would stay open. The stop tokens are the engine's EOS ids,
the tokens that end a request: once a grammar is complete, they are all its mask allows.

The compiler keeps every compiled grammar in xgrammar's own cache, keyed by the grammar's text, so the
front end (which compiles to check a request when it is added) and the runner (which compiles again to
build the request's matcher) compile each grammar once.
"""

from __future__ import annotations

import re
import threading

import torch
import xgrammar

from engine.core.structured_outputs import StructuredOutputsParams, shorten
from engine.runner.structured_output.grammar_specs import GrammarSpec, grammar_spec

# What each kind's value must be, for error messages.
_WHAT = {"json": "JSON schema", "json_object": "JSON object request", "regex": "regular expression",
         "choice": "list of choices", "grammar": "EBNF grammar"}

# xgrammar's C++ errors start with a time stamp and a source location ("[06:36:03] /project/cpp/x.cc:83: "),
# and failed checks with the check itself; neither helps the user fix the request.
_LOG_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: (Check failed: .*? is false: )?")
# Reasons are cut to this many characters: a parse error quotes the rest of the input.
_MAX_REASON_CHARS = 200

# Compile with one thread: the machine's cores belong to the model; a grammar of a request compiles in
# milliseconds, and xgrammar's worker pool would only add threads that compete with torch's.
_COMPILER_THREADS = 1


class XgrammarBackend:
    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: list[int]) -> None:
        self.vocab_size = vocab_size
        self.tokenizer_info = xgrammar.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=list(stop_token_ids) or None)
        self.compiler = xgrammar.GrammarCompiler(self.tokenizer_info, max_threads=_COMPILER_THREADS,
                                                 cache_enabled=True)
        # The front end compiles on its thread, the engine on its own: one compile at a time keeps the
        # compiler and its cache out of any question of thread safety, at the cost of a few milliseconds.
        self._lock = threading.Lock()

    def compile(self, params: StructuredOutputsParams) -> xgrammar.CompiledGrammar:
        """The compiled grammar, or a ValueError naming the field and its (shortened) value."""
        spec = grammar_spec(params)
        try:
            with self._lock:
                return self._compile(spec)
        except (RuntimeError, ValueError) as error:
            kind = params.kind
            reason = _LOG_PREFIX.sub("", str(error).strip().splitlines()[0] if str(error).strip() else "")
            if len(reason) > _MAX_REASON_CHARS:
                reason = reason[:_MAX_REASON_CHARS - 3] + "..."
            raise ValueError(f"SamplingParams.structured_outputs.{kind} is not a valid {_WHAT[kind]} "
                             f"({reason or type(error).__name__}), got {shorten(getattr(params, kind))}") from None

    def _compile(self, spec: GrammarSpec) -> xgrammar.CompiledGrammar:
        if spec.method == "json_schema":
            return self.compiler.compile_json_schema(spec.source, any_whitespace=spec.any_whitespace)
        if spec.method == "regex":
            return self.compiler.compile_regex(spec.source)
        return self.compiler.compile_grammar(spec.source)

    def new_matcher(self, compiled: xgrammar.CompiledGrammar) -> xgrammar.GrammarMatcher:
        # Rollback is unbounded in xgrammar 0.2 (max_rollback_tokens is deprecated and always unlimited), so a
        # matcher can follow the scheduler back over any number of tokens (request_grammar.py relies on it).
        return xgrammar.GrammarMatcher(compiled)

    def allocate_bitmask(self, num_rows: int) -> torch.Tensor:
        """An int32 [num_rows, ceil(vocab / 32)] bitmask in host memory (xgrammar fills it on the CPU)."""
        return xgrammar.allocate_token_bitmask(num_rows, self.vocab_size)

    @staticmethod
    def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
        """Set to -inf, in place, the logits of the tokens each row in ``rows`` may not take; other rows are
        untouched. xgrammar picks its CPU kernel or its GPU one from the logits' device."""
        if bitmask.device != logits.device:
            bitmask = bitmask.to(logits.device, non_blocking=True)
        xgrammar.apply_token_bitmask_inplace(logits, bitmask, indices=rows)
