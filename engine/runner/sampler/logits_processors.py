"""Request-level logits processors, applied in place to float32 logits [N, vocab] in vLLM's order:
allowed tokens, bad words, min_tokens, logit bias. Banned tokens get -inf, which no later stage
(penalties, temperature, truncation) can bring back.
"""

from __future__ import annotations

import torch

from engine.runner.sampler.metadata import SamplingMetadata


def apply_allowed_token_ids(logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
    if metadata.allowed_token_ids_mask is not None:
        logits.masked_fill_(metadata.allowed_token_ids_mask, float("-inf"))
    return logits


def bad_word_bans(metadata: SamplingMetadata) -> tuple[list[int], list[int]]:
    """(rows, token ids) to ban: a bad word's last token is banned when the row's output ends with the
    word's other tokens. A single-token word has an empty prefix, so it is banned always. Only the
    generated tokens count: bad words constrain the text the model writes, not the prompt."""
    rows, tokens = [], []
    for row, words in metadata.bad_words_token_ids.items():
        output = metadata.output_token_ids[row]
        for word in words:
            prefix = word[:-1]
            if len(prefix) > len(output):
                continue
            if not prefix or output[len(output) - len(prefix):] == prefix:
                rows.append(row)
                tokens.append(word[-1])
    return rows, tokens


def apply_bad_words(logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
    if metadata.bad_words_token_ids:
        _ban(logits, *bad_word_bans(metadata))
    return logits


def apply_min_tokens(logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
    """While a row has produced fewer than min_tokens tokens, it may not emit EOS or a stop token.

    Unlike vLLM, a row with ``ignore_eos`` keeps its EOS ids here: EOS does not end it, so nothing is
    gained by banning it. vLLM bans every EOS id of the model (its ``all_stop_token_ids``) regardless,
    so with ``ignore_eos`` and ``min_tokens`` an EOS token may appear among the first tokens here but
    not there.
    """
    rows, tokens = [], []
    for row, (min_tokens, stop_ids) in metadata.min_tokens.items():
        if len(metadata.output_token_ids[row]) < min_tokens:
            rows.extend([row] * len(stop_ids))
            tokens.extend(stop_ids)
    _ban(logits, rows, tokens)
    return logits


def apply_logit_bias(logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
    rows, tokens, values = [], [], []
    for row, bias in enumerate(metadata.logit_bias):
        if bias:
            rows.extend([row] * len(bias))
            tokens.extend(bias.keys())
            values.extend(bias.values())
    if rows:
        index = (torch.tensor(rows, device=logits.device), torch.tensor(tokens, device=logits.device))
        logits.index_put_(index, torch.tensor(values, dtype=logits.dtype, device=logits.device), accumulate=True)
    return logits


def _ban(logits: torch.Tensor, rows: list[int], tokens: list[int]) -> None:
    if rows:
        index = (torch.tensor(rows, device=logits.device), torch.tensor(tokens, device=logits.device))
        logits.index_put_(index, torch.tensor(float("-inf"), dtype=logits.dtype, device=logits.device))
