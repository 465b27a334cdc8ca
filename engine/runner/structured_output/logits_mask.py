"""Masking one step's logits with the grammars of the rows that have one (the runner's step, before sampling).

Applied to the model's logits before the sampler, so before every other logits processor and before the
logprobs are read, as vLLM V1 applies its grammar bitmask: a token the grammar forbids has probability
zero in the returned logprobs too, and no bias or penalty can bring it back.

Rows without a grammar cost nothing: the runner calls this only when some row constrains, the bitmask is
allocated only then, and only the constrained rows' logits are written (xgrammar's ``indices``).
"""

from __future__ import annotations

import torch

from engine.runner.structured_output.request_grammar import RequestGrammar


def apply_grammar_masks(logits: torch.Tensor, grammars: list[tuple[int, RequestGrammar]], backend) -> None:
    """``grammars``: (logits row, grammar) for each row whose next token is constrained. In place."""
    bitmask = backend.allocate_bitmask(logits.shape[0])
    rows = [row for row, grammar in grammars if grammar.fill_bitmask(bitmask, row)]
    if rows:  # a grammar that allows every token (rare: "any string" at this point) needs no masking
        backend.apply_bitmask(logits, bitmask, rows)


def constrained_rows(states) -> list[tuple[int, RequestGrammar]]:
    """(row, grammar) for the rows among ``states`` (request states, in logits-row order) to be masked."""
    return [(row, state.grammar) for row, state in enumerate(states)
            if state.grammar is not None and state.grammar.constrains]


def mask_draft_positions(logits: torch.Tensor, states, drafts, backend) -> None:
    """A verification's logits (len(drafts[i]) + 1 rows per request ``states[i]``, in order) masked, for the
    requests with a grammar, by the grammar's state after each draft before the row (RequestGrammar
    .fill_draft_bitmasks). In place; nothing is allocated when no request constrains."""
    grammars, first_row = [], 0
    for state, request_drafts in zip(states, drafts):
        if state.grammar is not None and state.grammar.constrains:
            grammars.append((first_row, state.grammar, list(request_drafts)))
        first_row += len(request_drafts) + 1
    if not grammars:
        return
    bitmask = backend.allocate_bitmask(logits.shape[0])
    rows = [row for first, grammar, request_drafts in grammars
            for row in grammar.fill_draft_bitmasks(bitmask, first, request_drafts)]
    if rows:
        backend.apply_bitmask(logits, bitmask, rows)
