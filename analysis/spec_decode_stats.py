"""What a run's speculative decoding did: drafts verified, tokens accepted, by position.

The counts come from each engine's scheduler (engine.core.spec_decode.SpecDecodingStats.to_dict(), one dict
per engine); a cluster's engines are summed. As vLLM reports them: a draft is one request's drafts verified in
one step; the acceptance rate is accepted draft tokens over draft tokens verified; the mean acceptance
length is the tokens a verification produced on average (its accepted drafts plus the token sampled after
them), so 1 is no gain at all and 1 + num_speculative_tokens the most there is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def merge_spec_decoding(counts: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The summed counts and the rates derived from them; None when no engine speculated.

    ``acceptance_rate_per_position[i]``: the share of drafts whose i-th token was accepted (vLLM's per-position
    acceptance rate, which counts every draft, shorter ones too); ``conditional_acceptance_per_position[i]``:
    accepted at position i over the drafts whose i-th token was judged (proposed, and every token before it
    accepted), the probability that a workload's ``acceptance_rate`` list states. A draft shorter than i + 1
    tokens (an n-gram lookup's, or one trimmed at a request's end) does not count at i. Counts recorded before
    the judged ones were (no ``num_judged_tokens_per_position``) divide by the accepted at i - 1 instead.
    ``proposal_rate_per_position[i]``: of the proposals that held i drafts, the share that held an (i + 1)-th (of
    every proposal for i = 0): what a workload's ``proposal_rate`` states (an n-gram lookup may find nothing, or
    fewer than k tokens; a draft model's is all ones). Absent from counts recorded before proposals were."""
    if not counts:
        return None
    num_speculative_tokens = max(each["num_speculative_tokens"] for each in counts)
    per_position = [0] * num_speculative_tokens
    for each in counts:
        for position, accepted in enumerate(each["num_accepted_tokens_per_position"]):
            per_position[position] += accepted
    num_drafts = sum(each["num_drafts"] for each in counts)
    num_draft_tokens = sum(each["num_draft_tokens"] for each in counts)
    num_accepted = sum(each["num_accepted_tokens"] for each in counts)
    if all("num_judged_tokens_per_position" in each for each in counts):
        judged = [0] * num_speculative_tokens
        for each in counts:
            for position, count in enumerate(each["num_judged_tokens_per_position"]):
                judged[position] += count
    else:
        judged = None
    previous = judged or [num_drafts, *per_position[:-1]]
    proposals = None
    if all("num_proposed_tokens_per_position" in each for each in counts):
        num_proposals = sum(each["num_proposals"] for each in counts)
        proposed = [0] * num_speculative_tokens
        for each in counts:
            for position, count in enumerate(each["num_proposed_tokens_per_position"]):
                proposed[position] += count
        proposals = {"num_proposals": num_proposals, "num_proposed_tokens_per_position": proposed,
                     "proposal_rate_per_position": [offered / asked if asked else 0.0 for offered, asked
                                                    in zip(proposed, [num_proposals, *proposed[:-1]])]}
    return {
        "num_speculative_tokens": num_speculative_tokens,
        "num_drafts": num_drafts,
        "num_draft_tokens": num_draft_tokens,
        "num_accepted_tokens": num_accepted,
        "num_accepted_tokens_per_position": per_position,
        **({"num_judged_tokens_per_position": judged} if judged is not None else {}),
        "acceptance_rate": num_accepted / num_draft_tokens if num_draft_tokens else 0.0,
        "mean_acceptance_length": 1.0 + num_accepted / num_drafts if num_drafts else 0.0,
        "acceptance_rate_per_position": [accepted / num_drafts if num_drafts else 0.0 for accepted in per_position],
        "conditional_acceptance_per_position": [accepted / before if before else 0.0
                                                for accepted, before in zip(per_position, previous)],
        **(proposals or {}),
    }


def spec_decoding_rows(spec: dict[str, Any] | None, format_percent, format_number) -> list[tuple[str, str]]:
    """The report's rows for a run's ``spec_decoding`` (none without it): what it accepted, and the measured lists a
    simulation of the same traffic takes (acceptance_rate, and for a proposer that sometimes offers fewer drafts, an
    n-gram lookup, proposal_rate): a real run's measured lists close the loop from the real proposer to the
    simulator."""
    if not spec:
        return []
    rows = [(f"speculative decoding ({spec.get('num_speculative_tokens')} drafts)",
             f"{format_percent(spec.get('acceptance_rate'))} of draft tokens accepted, "
             f"{format_number(spec.get('mean_acceptance_length'), 2)} tokens per verification")]
    by_position = spec.get("conditional_acceptance_per_position")
    if by_position and spec.get("num_drafts"):
        rows.append(("acceptance by position (acceptance_rate)", _listed(by_position)))
    offered = spec.get("proposal_rate_per_position")
    if offered and spec.get("num_proposals") and min(offered) < 1:
        rows.append(("proposals by position (proposal_rate)", _listed(offered)))
    return rows


def _listed(rates: Sequence[float]) -> str:
    return "[" + ", ".join(f"{rate:.2f}" for rate in rates) + "]"
