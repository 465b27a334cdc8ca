"""Runner logprob payloads -> vLLM's per-position ``{token_id: Logprob}`` dicts.

The runner sends, per generated position, the sampled token's logprob and rank plus the top-k
(``TokenLogprobs``). A dict keeps one entry per token id, so when the sampled token is also among the
top-k it appears once, with its rank. ``cumulative_logprob`` sums the sampled tokens' logprobs; like
vLLM it is None unless the request asked for logprobs.
"""

from __future__ import annotations

from engine.outputs import Logprob, PromptLogprobs, SampleLogprobs
from engine.runner.logprobs_lists import TokenLogprobs


class TokenDecoder:
    """Token id -> its own text, cached: the same few thousand ids recur in every request's logprobs."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str | None:
        if self.tokenizer is None:
            return None
        text = self._cache.get(token_id)
        if text is None:
            text = self._cache[token_id] = self.tokenizer.decode([token_id])
        return text


def make_logprob_dict(position: TokenLogprobs, decode: TokenDecoder) -> dict[int, Logprob]:
    token_ids, logprobs, sampled_rank = position
    entries = {token_ids[0]: Logprob(logprobs[0], sampled_rank, decode(token_ids[0]))}
    for top_rank, (token_id, logprob) in enumerate(zip(token_ids[1:], logprobs[1:]), start=1):
        if token_id not in entries:
            entries[token_id] = Logprob(logprob, top_rank, decode(token_id))
    return entries


class LogprobsProcessor:
    def __init__(self, decode: TokenDecoder, num_logprobs: int | None, num_prompt_logprobs: int | None) -> None:
        self.decode = decode
        self.logprobs: SampleLogprobs | None = [] if num_logprobs is not None else None
        self.cumulative_logprob: float | None = 0.0 if num_logprobs is not None else None
        self.wants_prompt_logprobs = num_prompt_logprobs is not None
        self.prompt_logprobs: PromptLogprobs | None = None

    def update_from_output(self, payload) -> None:
        """Add one step's positions: a TokenLogprobs, or a list of them (several tokens in one step)."""
        if self.logprobs is None or payload is None:
            return
        positions = [payload] if isinstance(payload, TokenLogprobs) else payload
        for position in positions:
            self.logprobs.append(make_logprob_dict(position, self.decode))
            self.cumulative_logprob += position.logprobs[0]

    def set_prompt_logprobs(self, positions: list[TokenLogprobs] | None) -> None:
        if not self.wants_prompt_logprobs or positions is None:
            return
        self.prompt_logprobs = [None] + [make_logprob_dict(position, self.decode) for position in positions]
