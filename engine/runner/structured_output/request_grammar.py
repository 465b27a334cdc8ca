"""One request's grammar state in the runner: an xgrammar ``GrammarMatcher`` and the tokens it has accepted.

Invariant: ``token_ids`` is a prefix of the request's ``output_token_ids`` (the runner's, which follow the
scheduler's), and the matcher's state is the grammar after exactly those tokens. The prefix is the whole
output, except in two cases where the grammar stops steering the request:

- terminated: the matcher accepted a stop token (an EOS id). Every EOS id ends a request, so only a request
  with ``ignore_eos`` goes on from here, and it goes on unconstrained: the grammar has nothing left to say
  about text after its end, and banning every token would leave nothing to sample.
- abandoned: the matcher refused a sampled token. The mask allows only tokens the grammar accepts, so this
  happens only when a later logits processor banned every one of them (``min_tokens`` banning the stop
  tokens of a finished grammar, say) and the sampler drew from what was left. The output has left the
  grammar; constraining it further cannot make it valid, so the request continues unconstrained.

With a reasoning model (``reasoning_end``: the end tag's token ids, vLLM's structured outputs under a reasoning
parser), the grammar steers the answer after the thought: it sleeps, every token allowed, until the output holds
the end tag, and ``token_ids`` is a prefix of the output after it (``start``: where that is; None while thinking).

``sync`` restores the invariant whenever the scheduler's copy of the output changes under the runner: after
it keeps fewer tokens than were sampled (truncation) and after a preemption, when the request resumes with
the output the scheduler kept. It rolls the matcher back to the longest common prefix and replays the rest.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


class RequestGrammar:
    __slots__ = ("req_id", "matcher", "token_ids", "abandoned", "reasoning_end", "start", "thought")

    def __init__(self, req_id: str, matcher, reasoning_end: list[int] | None = None) -> None:
        self.req_id = req_id
        self.matcher = matcher  # an xgrammar.GrammarMatcher (typed loosely: this module never imports xgrammar)
        self.token_ids: list[int] = []
        self.abandoned = False
        self.reasoning_end = list(reasoning_end) if reasoning_end else None
        self.start: int | None = None if self.reasoning_end else 0
        self.thought: list[int] = []  # the output so far while thinking

    @property
    def constrains(self) -> bool:
        """Whether the next token is masked: the thought is over and the grammar neither over nor abandoned."""
        return self.start is not None and not self.abandoned and not self.matcher.is_terminated()

    def fill_bitmask(self, bitmask, row: int) -> bool:
        """Write the allowed next tokens into ``bitmask[row]``; False when every token is allowed (no need to
        apply the row). Only called while ``constrains``: xgrammar refuses to fill for a terminated matcher."""
        return self.matcher.fill_next_token_bitmask(bitmask, row)

    def accept(self, token_id: int) -> None:
        """Advance over a sampled token. Tokens after the grammar ended or was abandoned are not tracked; a
        token of the thought only moves the wait for its end tag."""
        if self.start is None:
            self.thought.append(token_id)
            end = self.reasoning_end
            if self.thought[-len(end):] == end:
                self.start = len(self.thought)
            return
        if not self.constrains:
            return
        if self.matcher.accept_token(token_id):
            self.token_ids.append(token_id)
            return
        self.abandoned = True
        logger.warning("request %s: sampled token %d is outside its grammar (a later logits processor banned every "
                       "token the grammar allows); its output is no longer constrained", self.req_id, token_id)

    def valid_draft_prefix(self, drafts: list[int]) -> int:
        """How many of ``drafts`` the grammar accepts in a row from its state now (0 once it no longer
        constrains); the state is left as it was. Drafts past the grammar's end are not speculated."""
        if not self.constrains:
            return 0
        accepted = 0
        for token_id in drafts:
            if self.matcher.is_terminated() or not self.matcher.accept_token(token_id):
                break
            accepted += 1
        if accepted:
            self.matcher.rollback(accepted)
        return accepted

    def fill_draft_bitmasks(self, bitmask, first_row: int, drafts: list[int]) -> list[int]:
        """Rows ``first_row .. first_row + len(drafts)`` of ``bitmask``: the allowed tokens after the request's
        known tokens, then after each draft in turn (the positions a verification scores). Returns the rows to
        apply; the state is left as it was. A draft the grammar refuses ends the filling: the model's masked
        distribution there refuses it, so no later position is kept."""
        rows, accepted = [], 0
        for position in range(len(drafts) + 1):
            if self.abandoned or self.matcher.is_terminated():
                break
            if self.matcher.fill_next_token_bitmask(bitmask, first_row + position):
                rows.append(first_row + position)
            if position == len(drafts) or not self.matcher.accept_token(drafts[position]):
                break
            accepted += 1
        if accepted:
            self.matcher.rollback(accepted)
        return rows

    def sync(self, output_token_ids: list[int]) -> None:
        """Make the matcher's state the grammar after ``output_token_ids`` (see the module docstring)."""
        if self.reasoning_end is not None:
            if self.start is None or len(output_token_ids) < self.start \
                    or output_token_ids[:self.start] != self.thought[:self.start]:
                # The thought itself changed (or never ended): wait again from the output's first token.
                self.matcher.rollback(len(self.token_ids))
                self.token_ids.clear()
                self.start, self.thought = None, []
                for index, token_id in enumerate(output_token_ids):
                    self.accept(token_id)
                    if self.start is not None:
                        output_token_ids = output_token_ids[index + 1:]
                        break
                else:
                    return
            else:
                output_token_ids = output_token_ids[self.start:]
        token_ids = self.token_ids
        common = 0
        limit = min(len(token_ids), len(output_token_ids))
        while common < limit and token_ids[common] == output_token_ids[common]:
            common += 1
        if common < len(token_ids):
            self.matcher.rollback(len(token_ids) - common)
            del token_ids[common:]
        # Abandonment and termination are both re-derived by the replay: the refused token may be gone now.
        self.abandoned = False
        for token_id in output_token_ids[common:]:
            if not self.constrains:
                break
            self.accept(token_id)
