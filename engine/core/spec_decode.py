"""Speculative decoding's bookkeeping in the core: drafts in, verified tokens out, computed counts rolled back.

After a step samples a request's token, the executor may propose up to ``num_speculative_tokens`` draft
tokens that it guesses come next (an n-gram match in the real runner, a drawn acceptance in the simulator).
The next ``schedule()`` gives a decoding request its last token plus its drafts as one chunk
(``SchedulerOutput.scheduled_spec_decode_tokens``), so one forward pass scores every position. The executor
keeps the drafts that match what it samples at each position, and samples one more token after the last
kept one: ``sampled_token_ids`` lists 1 to drafts + 1 tokens. The update appends them and takes back the
computed positions of the rejected drafts.

Invariants:
- Drafts are never in ``all_token_ids`` until accepted, so no block holding one is hashed, cached or offloaded
  (the prefix cache only registers full blocks of known tokens; see ``KVCacheManager.allocate_slots``).
- A request's KV at the rejected positions is stale until those positions are computed again; they lie at or
  after its ``num_computed_tokens`` once rolled back, where nothing reads them first.
- A request never holds more drafts than tokens it may still produce, less the one it samples anyway, nor more
  than fit under the length limit (``trim_drafts``), so a verification never computes past either.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from engine.core.request import Request


def trim_drafts(request: Request, drafts: Sequence[int], num_speculative_tokens: int, max_model_len: int) -> list[int]:
    """The drafts ``request`` may be scheduled with: at most ``num_speculative_tokens``, none past the tokens
    it may still produce (``max_tokens`` less the one it samples anyway), none past ``max_model_len``."""
    room = min(num_speculative_tokens, request.max_tokens - len(request.output_token_ids) - 1,
               max_model_len - request.num_tokens)
    return list(drafts[:room]) if room > 0 else []


@dataclass(slots=True)
class SpecDecodingStats:
    """Counts over an engine's life, as vLLM's spec-decode metrics report them: a draft is one request's drafts
    verified in one step."""
    num_speculative_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # How many drafts had their i-th token accepted (acceptance by position).
    num_accepted_tokens_per_position: list[int] = field(default_factory=list)
    # How many drafts had their i-th token judged: one was proposed there and every token before it accepted. The
    # conditional acceptance at i is accepted over judged; a proposer that offers fewer than k drafts (an n-gram
    # lookup) leaves a position unjudged rather than rejected.
    num_judged_tokens_per_position: list[int] = field(default_factory=list)
    # The proposer's side: how many times it was asked for drafts (a request that sampled and goes on), and how many
    # of its proposals held an i-th draft (before the trim to what the request may still produce). An n-gram lookup
    # may find nothing, or fewer than k tokens; a draft model always offers k.
    num_proposals: int = 0
    num_proposed_tokens_per_position: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("num_accepted_tokens_per_position", "num_judged_tokens_per_position",
                     "num_proposed_tokens_per_position"):
            if not getattr(self, name):
                setattr(self, name, [0] * self.num_speculative_tokens)

    def record(self, num_draft_tokens: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        per_position = self.num_accepted_tokens_per_position
        for position in range(num_accepted):
            per_position[position] += 1
        judged = self.num_judged_tokens_per_position
        for position in range(min(num_accepted + 1, num_draft_tokens)):
            judged[position] += 1

    def record_proposal(self, num_proposed: int) -> None:
        self.num_proposals += 1
        proposed = self.num_proposed_tokens_per_position
        for position in range(min(num_proposed, self.num_speculative_tokens)):
            proposed[position] += 1

    def since(self, earlier: SpecDecodingStats) -> SpecDecodingStats:
        """The counts added after ``earlier`` (a copy of these stats taken then)."""
        def minus(now: list[int], then: list[int]) -> list[int]:
            return [a - b for a, b in zip(now, then)]

        return SpecDecodingStats(
            self.num_speculative_tokens, self.num_drafts - earlier.num_drafts,
            self.num_draft_tokens - earlier.num_draft_tokens, self.num_accepted_tokens - earlier.num_accepted_tokens,
            minus(self.num_accepted_tokens_per_position, earlier.num_accepted_tokens_per_position),
            minus(self.num_judged_tokens_per_position, earlier.num_judged_tokens_per_position),
            self.num_proposals - earlier.num_proposals,
            minus(self.num_proposed_tokens_per_position, earlier.num_proposed_tokens_per_position))

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens over draft tokens verified (0 before any)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens a verified draft produced on average: its accepted tokens plus the one sampled after them."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0

    def to_dict(self) -> dict:
        return {"num_speculative_tokens": self.num_speculative_tokens, "num_drafts": self.num_drafts,
                "num_draft_tokens": self.num_draft_tokens, "num_accepted_tokens": self.num_accepted_tokens,
                "num_accepted_tokens_per_position": list(self.num_accepted_tokens_per_position),
                "num_judged_tokens_per_position": list(self.num_judged_tokens_per_position),
                "num_proposals": self.num_proposals,
                "num_proposed_tokens_per_position": list(self.num_proposed_tokens_per_position),
                "acceptance_rate": self.acceptance_rate, "mean_acceptance_length": self.mean_acceptance_length}
