"""Prompt token ids: random fresh tokens, shared group prefixes, and Mooncake's hashed blocks.

Token ids are uniform over the vocabulary minus the reserved ids (the model's special tokens: a BOS or
EOS in the middle of a synthetic prompt would change what a real model does with it).

Mooncake blocks are derived from (seed, hash id) by an integer hash rather than a random generator,
so equal ids give equal tokens in any request, in any order, in any subset of the trace.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from workloads.errors import Problem, WorkloadError

# splitmix64 constants (Steele, Lea and Flood, 2014): a fast, well-mixed 64-bit integer hash.
_GOLDEN_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX_MULTIPLIER_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_MULTIPLIER_2 = np.uint64(0x94D049BB133111EB)


def _mix64(values: np.ndarray) -> np.ndarray:
    # uint64 arithmetic wraps modulo 2**64 in numpy arrays, which is what the hash relies on.
    mixed = values.astype(np.uint64) + _GOLDEN_GAMMA
    mixed = (mixed ^ (mixed >> np.uint64(30))) * _MIX_MULTIPLIER_1
    mixed = (mixed ^ (mixed >> np.uint64(27))) * _MIX_MULTIPLIER_2
    return mixed ^ (mixed >> np.uint64(31))


class TokenVocabulary:
    """The token ids a synthetic prompt may contain: [0, vocab_size) minus the reserved ids."""

    def __init__(self, vocab_size: int, reserved_token_ids: Iterable[int] = ()) -> None:
        if not isinstance(vocab_size, (int, np.integer)) or isinstance(vocab_size, bool) or vocab_size < 1:
            raise WorkloadError(Problem("vocab_size", "must be an integer >= 1", vocab_size))
        # Reserved ids outside the vocabulary could never be drawn anyway, so they are simply ignored.
        reserved = np.fromiter((int(token) for token in reserved_token_ids), dtype=np.int64)
        self.allowed = np.setdiff1d(np.arange(int(vocab_size), dtype=np.int64), reserved)
        if len(self.allowed) == 0:
            raise WorkloadError(Problem("reserved_token_ids", "leave no token id to draw prompts from", vocab_size))

    def random_tokens(self, rng: np.random.Generator, count: int) -> np.ndarray:
        return self.allowed[rng.integers(0, len(self.allowed), size=count)]

    def hashed_blocks(self, seed: int, hash_ids: np.ndarray, block_size: int) -> np.ndarray:
        """A (len(hash_ids), block_size) array: row i is the block named by hash_ids[i]."""
        block_keys = _mix64(_mix64(np.asarray(hash_ids, dtype=np.uint64)) ^ _mix64(np.array([seed], dtype=np.uint64)))
        positions = np.arange(block_size, dtype=np.uint64)
        hashed = _mix64(block_keys[:, None] * _GOLDEN_GAMMA + positions[None, :])
        return self.allowed[(hashed % np.uint64(len(self.allowed))).astype(np.int64)]


def assemble_prompts(
    prompt_lens: np.ndarray,
    leading_tokens: Sequence[Sequence[int] | None],
    draw_fresh_tokens: Callable[[int], np.ndarray],
) -> list[array]:
    """Every prompt: its leading tokens (a shared prefix or hashed blocks, cut to the prompt length),
    then fresh tokens. The fresh tokens of all prompts are drawn in one call, in request order.

    Prompts are ``array('q')``: eight bytes a token and no Python int object per token, so 10,000
    prompts of ~1,000 tokens take a fraction of a second and a tenth of the memory of tuples. The
    engine core keeps token ids in the same type and hashes blocks straight from its bytes.
    """
    lengths = np.asarray(prompt_lens, dtype=np.int64).tolist()
    leading_arrays = [None if leading is None else array("q", leading) for leading in leading_tokens]
    leading_lens = [
        0 if leading is None else min(len(leading), length)
        for leading, length in zip(leading_arrays, lengths, strict=True)
    ]
    fresh_counts = [length - leading_len for length, leading_len in zip(lengths, leading_lens, strict=True)]
    fresh = np.ascontiguousarray(draw_fresh_tokens(sum(fresh_counts)), dtype=np.int64).tobytes()
    prompts: list[array] = []
    position = 0
    for leading, leading_len, count in zip(leading_arrays, leading_lens, fresh_counts, strict=True):
        prompt = leading[:leading_len] if leading_len else array("q")
        prompt.frombytes(fresh[position * 8 : (position + count) * 8])
        position += count
        prompts.append(prompt)
    return prompts
