"""Putting a request's images into its prompt: a run of placeholder tokens per image after its leading tokens.

The placeholder is the vocabulary's last token id (kept out of the text while a workload has images). Every
image's placeholders are the same token, as a real processor's are; what tells two images apart is their
identifiers, which the engine's block hashes and encoder cache key on (engine/core/multimodal.py).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Sequence

from workloads.errors import Problem, WorkloadError
from workloads.images import ImageSection


def image_token_id(vocab_size: int) -> int:
    return vocab_size - 1


@dataclass(frozen=True, slots=True)
class ImageDraws:
    placeholder_token_id: int
    # The model's vision encoder's placeholder tokens per image (None: not fixed, or no encoder known).
    default_tokens_per_image: int | None

    def draw(self, section: ImageSection | None, seed: int, count: int, where: str
             ) -> list[tuple[tuple[str, int], ...]]:
        """Per request, its images (identifier, tokens); all () without a section."""
        if section is None:
            return [()] * count
        try:
            return section.draw(seed, count, self.default_tokens_per_image)
        except ValueError as error:
            raise WorkloadError(Problem(f"{where}.tokens_per_image", str(error), None)) from None

    def place(self, prompts: list[array], leading: Sequence[Sequence[int] | None],
              shown: list[tuple[tuple[str, int], ...]]) -> list[tuple[tuple[str, int, int], ...]]:
        """Insert each request's placeholder runs after its leading tokens (in place); return its images as
        (identifier, offset, tokens)."""
        placed: list[tuple[tuple[str, int, int], ...]] = []
        for index, images in enumerate(shown):
            if not images:
                placed.append(())
                continue
            prompt = prompts[index]
            offset = 0 if leading[index] is None else min(len(leading[index]), len(prompt))
            runs = []
            placeholders = array("q")
            for identifier, tokens in images:
                runs.append((identifier, offset + len(placeholders), tokens))
                placeholders.extend([self.placeholder_token_id] * tokens)
            prompt[offset:offset] = placeholders
            placed.append(tuple(runs))
        return placed
