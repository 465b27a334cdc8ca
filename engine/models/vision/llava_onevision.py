"""LLaVA-OneVision's image path (``LlavaOnevisionForConditionalGeneration``): LLaVA-NeXT's tiles
(engine/models/vision/llava_next.py) with a SigLIP tower, every patch kept (SigLIP has no class token), and a cap on
the grid's features: ``vision_aspect_ratio`` "anyres_max_N" allows N tiles' worth, and a larger unpadded map is
shrunk bilinearly by the square root of how much larger it is (when that passes 1.1), before the newlines.

A prompt that shows several images gets only each image's base tile and one newline (the processor makes no grid
for them, and the model packs them so): the prompt's images are processed together (``groups_prompt_images``)."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from engine.models.vision.llava_next import LlavaNextImageEncoder


class LlavaOnevisionImageEncoder(LlavaNextImageEncoder):
    family = "LLaVA-OneVision"
    default_strategy = "full"

    def __init__(self, raw: dict[str, Any]) -> None:
        super().__init__(raw)
        aspect = raw.get("vision_aspect_ratio", "anyres_max_9")
        count = aspect.removeprefix("anyres_max_") if isinstance(aspect, str) else ""
        if not count.isdigit() or int(count) < 1:
            raise ValueError(f"config.json: vision_aspect_ratio must be 'anyres_max_N', got {aspect!r}")
        self.max_tiles = int(count)

    groups_prompt_images = True

    def split_processed(self, processed) -> list[tuple[tuple[torch.Tensor, tuple[int, int]], int]]:
        """Per image ((its tiles, its size), tokens): all tiles for an image shown alone, the base tile for one of
        several in its prompt (``batch_num_images``)."""
        counts = [int(count) for count in processed["batch_num_images"].tolist()]
        alone = [count == 1 for count in counts for _ in range(count)]
        items = []
        for ((tiles, size), tokens), single in zip(super().split_processed(processed), alone):
            items.append(((tiles, size), tokens) if single else ((tiles[:1], size), self.patches ** 2 + 1))
        return items

    def pack(self, features: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        if features.shape[0] == 1:  # one of several images: its base tile and a newline
            return torch.cat([features[0], self.image_newline.to(features.dtype)[None]])
        return super().pack(features, size)

    def shrink(self, rows: int, columns: int) -> float | None:
        """How much an unpadded map of rows x columns is shrunk by (None: kept as it is)."""
        ratio = math.sqrt(rows * columns / (self.max_tiles * self.patches ** 2))
        return ratio if ratio > 1.1 else None

    def tokens_of(self, height: int, width: int) -> int:
        rows, columns = self.feature_map(height, width)
        ratio = self.shrink(rows, columns)
        if ratio is not None:
            rows, columns = int(rows // ratio), int(columns // ratio)
        return self.patches ** 2 + rows * (columns + 1)

    def resample(self, grid: torch.Tensor) -> torch.Tensor:
        rows, columns = grid.shape[:2]
        ratio = self.shrink(rows, columns)
        if ratio is None:
            return grid
        shrunk = F.interpolate(grid.permute(2, 0, 1)[None], [int(rows // ratio), int(columns // ratio)],
                               mode="bilinear")
        return shrunk[0].permute(1, 2, 0)
