"""Verifying drafts against the target model's distributions: the tokens a step with drafts produces.

A request scheduled with drafts ``d_1 .. d_s`` gets the model's logits at ``s + 1`` positions: after its last
token, and after each draft. Position ``j``'s distribution ``p_j`` (the request's temperature, top-k, top-p,
min-p, allowed tokens and logit bias applied, exactly as the sampler would) decides draft ``d_j``:

* greedy: kept while it is the argmax of ``p_j``; the first one that is not is replaced by that argmax. So
  the tokens are exactly those that decoding one token per step gives.
* random: position ``j``'s token is sampled from ``p_j`` exactly as the sampler samples (one exponential race,
  one [vocab] draw of the request's generator), and ``d_j`` is kept if it is that token. So a draft is kept
  with probability ``p_j(d_j)`` and a rejected one is replaced by a draw from ``p_j`` without ``d_j``: the
  rejection sampling of a deterministic proposal (the n-gram proposer's), each token distributed as ``p_j``.
  And a seeded request consumes its generator exactly as decoding one token per step does, so its tokens
  are those of decoding without drafts, whatever a step's token budget or batch let it verify.

After ``s`` kept drafts, one more token is sampled from ``p_{s+1}``. A request's output is 1 to s + 1 tokens.

Only requests whose distribution does not depend on the tokens of the same step are speculated
(``can_speculate``): no penalties, no bad words, min_tokens already reached. The others decode one token per
step. Logprobs, when asked for, come from the raw logits of each produced token's position
(``logprobs_of_tokens``), as the sampler gives them for one token.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.core.sampling_params import SamplingParams
from engine.runner.logprobs_lists import TokenLogprobs, token_logprobs_rows
from engine.runner.request_state import CachedRequestState
from engine.runner.sampler.logprobs import gather_logprobs
from engine.runner.sampler import Sampler
from engine.runner.sampler.topk_topp import apply_min_p, apply_temperature, apply_top_k_top_p, random_sample
from engine.runner.sampling_batch import build_sampling_metadata


def can_speculate(params: SamplingParams, num_output_tokens: int) -> bool:
    """Whether a request's next tokens may be drafted: its distribution at each position of a step must not
    depend on the tokens kept before it in the same step."""
    return (params.presence_penalty == 0.0 and params.frequency_penalty == 0.0 and params.repetition_penalty == 1.0
            and not params.bad_words and num_output_tokens >= params.min_tokens)


def verify_drafts(logits: torch.Tensor, states: Sequence[CachedRequestState], drafts: Sequence[Sequence[int]],
                  vocab_size: int) -> list[list[int]]:
    """Tokens for each request ``states[i]`` verified with ``drafts[i]``; ``logits`` holds len(drafts[i]) + 1
    rows per request, in order (after its last token, then after each draft)."""
    rows_per_request = [len(request_drafts) + 1 for request_drafts in drafts]
    expanded = [state for state, rows in zip(states, rows_per_request) for _ in range(rows)]
    metadata = build_sampling_metadata(expanded, vocab_size, logits.device)
    processed = Sampler.apply_logits_processors(logits.to(torch.float32, copy=True), metadata)
    greedy_tokens = processed.argmax(dim=-1).tolist()
    probabilities = None
    if not metadata.all_greedy:
        scaled = apply_temperature(processed.clone(), metadata.temperature)
        if metadata.min_p is not None:
            apply_min_p(scaled, metadata.min_p)
        probabilities = apply_top_k_top_p(scaled, metadata.top_k, metadata.top_p).softmax(dim=-1)

    results = []
    row = 0
    for state, request_drafts in zip(states, drafts):
        if state.sampling_params.temperature == 0.0 or probabilities is None:
            tokens = _verify_greedy(greedy_tokens[row:row + len(request_drafts) + 1], request_drafts)
        else:
            tokens = _verify_random(probabilities[row:row + len(request_drafts) + 1], request_drafts, state.generator)
        results.append(tokens)
        row += len(request_drafts) + 1
    return results


def logprobs_of_tokens(logits: torch.Tensor, states: Sequence[CachedRequestState],
                       drafts: Sequence[Sequence[int]], tokens: Sequence[list[int]]) -> list[list[TokenLogprobs] | None]:
    """For each request that asks for logprobs, one TokenLogprobs per token it produced (``tokens``, from
    ``verify_drafts`` on the same rows): the raw distribution at that token's position, as the sampler reports."""
    results: list[list[TokenLogprobs] | None] = []
    raw = None
    row = 0
    for state, request_drafts, request_tokens in zip(states, drafts, tokens):
        num_logprobs = state.sampling_params.logprobs
        if num_logprobs is None:
            results.append(None)
        else:
            if raw is None:
                raw = logits.to(torch.float32).log_softmax(dim=-1)
            token_ids = torch.tensor(request_tokens, dtype=torch.long, device=logits.device)
            tensors = gather_logprobs(raw[row:row + len(request_tokens)], num_logprobs, token_ids)
            results.append(token_logprobs_rows(tensors, num_logprobs))
        row += len(request_drafts) + 1
    return results


def _verify_greedy(targets: list[int], drafts: Sequence[int]) -> list[int]:
    tokens = []
    for target, draft in zip(targets, drafts):
        tokens.append(target)
        if target != draft:
            return tokens
    tokens.append(targets[len(drafts)])
    return tokens


def _verify_random(probabilities: torch.Tensor, drafts: Sequence[int], generator: torch.Generator | None) -> list[int]:
    """Sample each position's token as the sampler would (one exponential race, one [vocab] draw of the
    request's generator per token produced) and keep the draft while it equals that token. The draft is kept
    with probability p_j(d_j), a replacement is distributed as p_j without d_j: the rejection sampling of a
    deterministic draft. And a seeded request draws exactly what decoding one token per step draws, so its
    tokens do not depend on how many drafts a step verified (token budget, preemption, neighbours)."""
    generators = {0: generator} if generator is not None else {}
    tokens = []
    for position in range(len(drafts) + 1):
        token = int(random_sample(probabilities[position][None], generators)[0])
        tokens.append(token)
        if position == len(drafts) or token != drafts[position]:
            break
    return tokens
