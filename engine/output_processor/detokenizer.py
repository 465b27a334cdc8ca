"""Incremental detokenization: token ids arrive a few at a time, text must come out in order, and a
character must never be emitted before all of its bytes have arrived.

With a byte-level BPE tokenizer one emoji or CJK character can span several tokens; decoding a prefix
that ends inside such a character yields U+FFFD (the replacement character). The classic remedy
(Hugging Face's TextStreamer, vLLM's slow detokenizer) keeps two offsets into the token list:

    prefix_offset .. read_offset   tokens whose text was already emitted (kept as decoding context,
                                   because how a token decodes can depend on the token before it,
                                   e.g. SentencePiece's leading-space handling)
    read_offset ..                 tokens not yet emitted

Each update decodes ``tokens[prefix_offset:]`` and emits what it adds beyond the text of
``tokens[prefix_offset:read_offset]``, unless the new text ends in U+FFFD: then a character is still
incomplete and everything is held back until a later token completes it (or ``flush()`` at the end
gives up and emits the replacement character, as ``tokenizer.decode`` of the whole output would).

Invariant: after ``flush()``, ``output_text`` is the decoding of the output tokens in the context of
the prompt's last few tokens, so for prompts that end on a character boundary it equals
``tokenizer.decode(output_token_ids)`` (with the same ``skip_special_tokens``).
"""

from __future__ import annotations

REPLACEMENT_CHARACTER = "\ufffd"
# Prompt tokens kept as context for the first output tokens (vLLM uses 5 as well).
INITIAL_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool = True,
                 spaces_between_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.spaces_between_special_tokens = spaces_between_special_tokens
        self._token_ids: list[int] = list(prompt_token_ids[-INITIAL_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._token_ids)
        self._prefix_text: str | None = None  # text of tokens[prefix_offset:read_offset], cached
        self.output_text = ""

    def _decode(self, token_ids: list[int]) -> str:
        if not token_ids:
            return ""
        return self.tokenizer.decode(token_ids, skip_special_tokens=self.skip_special_tokens,
                                     spaces_between_special_tokens=self.spaces_between_special_tokens)

    def update(self, new_token_ids: list[int]) -> str:
        """Add tokens; return the text they complete (possibly empty), also appended to output_text."""
        delta = []
        for token_id in new_token_ids:
            self._token_ids.append(token_id)
            piece = self._decode_step(final=False)
            if piece:
                delta.append(piece)
        text = "".join(delta)
        self.output_text += text
        return text

    def flush(self) -> str:
        """Emit whatever is held back (an incomplete character decodes to U+FFFD); call when finished."""
        if self._read_offset >= len(self._token_ids):
            return ""
        text = self._decode_step(final=True)
        self.output_text += text
        return text

    def _decode_step(self, final: bool) -> str:
        token_ids = self._token_ids
        if self._prefix_text is None:
            self._prefix_text = self._decode(token_ids[self._prefix_offset:self._read_offset])
        prefix_text = self._prefix_text
        new_text = self._decode(token_ids[self._prefix_offset:])
        if len(new_text) <= len(prefix_text) and not final:
            # Nothing visible yet (a special token being skipped, or bytes of a character that
            # replaced the previous U+FFFD without growing the string).
            return ""
        if new_text.endswith(REPLACEMENT_CHARACTER) and not final:
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(token_ids)
        self._prefix_text = None
        # A prefix that itself ended in U+FFFD can decode differently once completed: compare the
        # common part only, so no character is ever emitted twice.
        if new_text.startswith(prefix_text):
            return new_text[len(prefix_text):]
        return new_text[_common_prefix(prefix_text, new_text):]

    @property
    def num_output_chars(self) -> int:
        return len(self.output_text)


def _common_prefix(a: str, b: str) -> int:
    length = min(len(a), len(b))
    for index in range(length):
        if a[index] != b[index]:
            return index
    return length
