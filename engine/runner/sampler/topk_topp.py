"""Random sampling: temperature, min-p, top-k, top-p, then a draw that honors per-request generators.

Truncation works on one ascending sort per row: top-k masks every token below the k-th largest logit
(a token tied with it survives too, as in vLLM and Hugging Face: ties are common with bfloat16 logits,
and keeping exactly k would choose among them by sort order), top-p masks the sorted prefix whose
cumulative probability stays within 1 - p (keeping the smallest set of most likely tokens with mass
>= p), and the result is scattered back to vocabulary order.

The draw is an exponential race: ``argmax(p_i / E_i)`` with ``E_i ~ Exp(1)`` picks token i with
probability p_i. It needs no cumulative sums, and the noise of each seeded row comes from that row's own
generator as one [vocab] draw, so a seeded request samples the same tokens whichever requests share
its batch.
"""

from __future__ import annotations

import torch

from engine.runner.sampler.metadata import SamplingMetadata


def apply_temperature(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    return logits.div_(temperature[:, None])


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Mask tokens whose probability is below ``min_p`` times the row's highest probability."""
    probs = logits.softmax(dim=-1)
    threshold = min_p[:, None] * probs.max(dim=-1, keepdim=True).values
    return logits.masked_fill_(probs < threshold, float("-inf"))


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None,
                      top_p: torch.Tensor | None) -> torch.Tensor:
    if top_k is None and top_p is None:
        return logits
    vocab_size = logits.shape[1]
    sorted_logits, sorted_index = logits.sort(dim=-1, descending=False)
    if top_k is not None:
        k = torch.where(top_k > 0, top_k, vocab_size).clamp(max=vocab_size)
        kth_largest = sorted_logits.gather(1, (vocab_size - k)[:, None])
        sorted_logits.masked_fill_(sorted_logits < kth_largest, float("-inf"))
    if top_p is not None:
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative <= (1 - top_p)[:, None]
        drop[:, -1] = False  # the most likely token always survives
        sorted_logits.masked_fill_(drop, float("-inf"))
    return logits.scatter_(1, sorted_index, sorted_logits)


def exponential_noise(shape: torch.Size, device: torch.device, generators: dict[int, torch.Generator]) -> torch.Tensor:
    noise = torch.empty(shape, dtype=torch.float32, device=device)
    if len(generators) < shape[0]:
        noise.exponential_()
    for row, generator in generators.items():
        noise[row].exponential_(generator=generator)
    # An exact 0 would turn p / E into inf (or NaN for p = 0); the clamp changes nothing else.
    return noise.clamp_min_(torch.finfo(torch.float32).tiny)


def random_sample(probs: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    noise = exponential_noise(probs.shape, probs.device, generators)
    return (probs / noise).argmax(dim=-1)


def sample_random(logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
    """Token ids [N] drawn from the temperature-scaled, truncated distribution of each row."""
    apply_temperature(logits, metadata.temperature)
    if metadata.min_p is not None:
        apply_min_p(logits, metadata.min_p)
    apply_top_k_top_p(logits, metadata.top_k, metadata.top_p)
    return random_sample(logits.softmax(dim=-1), metadata.generators)
