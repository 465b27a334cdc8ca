"""Reasoning between ``<think>`` and ``</think>`` (or a model's own pair of tags), split from the content of a whole
answer or of its deltas.

Invariant (checked by tests/serve/test_reasoning_parsers.py over random cuts): the reasoning of all the deltas,
joined, and their content, joined, equal ``extract`` on the whole answer (None and "" both meaning none). A delta's
text that could still be the start of a tag is held back until the next delta or the end says what it is.
"""

from __future__ import annotations

from dataclasses import dataclass

START, END = "<think>", "</think>"


class StreamingReasoningParser:
    """Fed an answer a delta at a time: ``feed`` returns the (reasoning, content) it is sure of; ``finish`` what
    was held back once the answer ends."""

    def __init__(self, thinks_at_once: bool, start: str = START, end: str = END) -> None:
        self._thinks_at_once = thinks_at_once
        self._start, self._end = start, end
        self._state = "opening"  # -> "thinking" -> "answering"
        self._held = ""

    def feed(self, delta: str) -> tuple[str, str]:
        self._held += delta
        reasoning, content = "", ""
        while True:
            if self._state == "opening":
                # Whether the answer opens with <think> (dropped either way), once enough of it is known.
                stripped = self._held.lstrip()
                if self._start.startswith(stripped) and len(stripped) < len(self._start):
                    return reasoning, content  # maybe the tag: wait
                if stripped.startswith(self._start):
                    self._held = stripped[len(self._start):]
                    self._state = "thinking"
                else:
                    self._state = "thinking" if self._thinks_at_once else "answering"
            elif self._state == "thinking":
                end = self._held.find(self._end)
                if end < 0:
                    keep = _tag_prefix_length(self._held, self._end)
                    reasoning += self._held[:len(self._held) - keep]
                    self._held = self._held[len(self._held) - keep:]
                    return reasoning, content
                reasoning += self._held[:end]
                self._held = self._held[end + len(self._end):]
                self._state = "answering"
            else:
                content += self._held
                self._held = ""
                return reasoning, content

    def finish(self) -> tuple[str, str]:
        """What was held back: reasoning while thinking (a cut thought), content otherwise."""
        held, self._held = self._held, ""
        if self._state == "opening":
            return ("", held) if not self._thinks_at_once else (held.lstrip().removeprefix(self._start), "")
        return (held, "") if self._state == "thinking" else ("", held)


def split_whole(stream, text: str) -> tuple[str | None, str | None]:
    """(reasoning, content) of a whole answer through a parser's ``stream`` (fed it at once, then finished), so that
    the whole and the streamed split are one code path; None where there is none."""
    reasoning, content = stream.feed(text)
    rest_reasoning, rest_content = stream.finish()
    return (reasoning + rest_reasoning) or None, (content + rest_content) or None


def _tag_prefix_length(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that begins ``tag`` (what may still become the tag)."""
    for length in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-length:]):
            return length
    return 0


@dataclass(frozen=True)
class ThinkTagsParser:
    # True: the answer starts inside the thought (DeepSeek-R1's template opens it); False: only an answer that
    # opens with <think> thinks (Qwen3).
    thinks_at_once: bool
    start_tag: str = START
    end_tag: str = END
    # A model that thinks only when the request's chat_template_kwargs turn this on (DeepSeek-V3.1's "thinking");
    # None: the answer alone tells.
    thinking_switch: str | None = None
    # The tags are text, not special tokens the answer's text would drop (harmony.py's markers are).
    keeps_special_tokens: bool = False

    def for_request(self, chat_template_kwargs: dict | None) -> "ThinkTagsParser | None":
        """The parser of one request (None: it does not think, its answer is all content)."""
        if self.thinking_switch is None or (chat_template_kwargs or {}).get(self.thinking_switch):
            return self
        return None

    def extract(self, text: str) -> tuple[str | None, str | None]:
        """(reasoning, content) of a whole answer; None where there is none."""
        return split_whole(self.streaming(), text)

    def streaming(self) -> StreamingReasoningParser:
        return StreamingReasoningParser(self.thinks_at_once, self.start_tag, self.end_tag)


