"""Shared by the image model tests: transformers' greedy tokens and prompt logprobs as references, from a function
that gives a model's logits over a whole sequence (with its images)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch


def picture(seed: int, height: int, width: int) -> np.ndarray:
    """A ``height`` x ``width`` RGB picture of random pixels (the same for the same seed)."""
    return np.random.RandomState(seed).randint(0, 256, (height, width, 3), dtype=np.uint8)


def greedy_by_forward(logits_of: Callable[[list[int]], torch.Tensor], prompt_ids: list[int], text_ids: list[int],
                      max_tokens: int) -> list[int]:
    """Greedy tokens, among ``text_ids``, by the model's forward over the whole sequence at each step (the model's
    definition; some families' cached ``generate`` departs from it in transformers 5.24)."""
    sequence = list(prompt_ids)
    for _ in range(max_tokens):
        logits = logits_of(sequence)[-1]
        sequence.append(text_ids[int(logits[text_ids].argmax())])
    return sequence[len(prompt_ids):]


def prompt_logprob_error(output, logits: torch.Tensor) -> float:
    """The largest difference between an engine output's prompt logprobs and the log-softmax of ``logits`` over
    the same prompt."""
    ids = output.prompt_token_ids
    reference = torch.log_softmax(logits.float(), dim=-1)
    return max(abs(output.prompt_logprobs[position][ids[position]].logprob - reference[position - 1, ids[position]].item())
               for position in range(1, len(ids)))
