"""``SamplingParams.bad_words`` as the token sequences the sampler bans (engine/runner/sampler.py)."""

from __future__ import annotations


def bad_words_token_ids(tokenizer, bad_words: list[str]) -> list[list[int]]:
    """Each word as token ids, bare and with a leading space (how it appears mid-sentence).

    vLLM keeps the spaced form only when it has as many tokens as the bare one and starts with a
    different token; here every distinct spaced form is kept, so a word whose spaced form
    tokenizes to a different length is banned mid-sentence too (a superset of vLLM's bans)."""
    if tokenizer is None:
        raise ValueError("SamplingParams.bad_words needs a tokenizer; the runner was created without one")
    variants: list[list[int]] = []
    for word in bad_words:
        for text in (word.lstrip(), " " + word.lstrip()):
            ids = tokenizer.encode(text, add_special_tokens=False)
            if ids and ids not in variants:
                variants.append(ids)
    return variants
