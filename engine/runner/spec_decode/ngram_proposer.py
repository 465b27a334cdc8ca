"""The n-gram proposer (prompt lookup decoding): drafts copied from where the sequence's tail occurred before.

For n from ``prompt_lookup_max`` down to ``prompt_lookup_min``, the last n tokens of the sequence (prompt and
output) are looked up earlier in it; at the first n with a match, the drafts are the tokens that followed
the latest earlier occurrence, up to ``num_speculative_tokens``. Latest, because the nearest repetition is
the likeliest to continue the same way (summaries, code edits and chat turns quote recent text). No match,
no drafts: the request decodes one token, as without speculation.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


class NgramProposer:
    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int) -> None:
        self.num_speculative_tokens = num_speculative_tokens
        self.prompt_lookup_min = prompt_lookup_min
        self.prompt_lookup_max = prompt_lookup_max

    def propose(self, token_ids: np.ndarray) -> list[int]:
        """Drafts to follow ``token_ids`` (a request's tokens so far), possibly none."""
        length = len(token_ids)
        for n in range(min(self.prompt_lookup_max, length - 1), self.prompt_lookup_min - 1, -1):
            # Windows starting at 0 .. length - n - 1: every earlier occurrence, never the tail itself.
            windows = sliding_window_view(token_ids[:-1], n)
            matches = np.flatnonzero((windows == token_ids[length - n:]).all(axis=1))
            if len(matches):
                start = int(matches[-1]) + n
                return token_ids[start:start + self.num_speculative_tokens].tolist()
        return []
