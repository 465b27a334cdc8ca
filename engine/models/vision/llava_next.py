"""LLaVA-NeXT's image path (LLaVA-1.6, ``LlavaNextForConditionalGeneration``): LLaVA's CLIP tower and projector
(engine/models/vision/llava.py) over "any resolution" tiles.

The processor picks, among ``image_grid_pinpoints``, the resolution that keeps most of the image's pixels and wastes
least (``best_resolution``), resizes and pads the image into it, and cuts it into tiles of the tower's size, after a
base tile of the whole image resized. Each tile is encoded as LLaVA encodes an image (576 features for 336-pixel
tiles of 14-pixel patches). The image's embeddings are the base tile's, then the grid tiles' features laid out as
one feature map, with the padding the resize added cut off again (``unpad``) and a learned ``image_newline`` at the
end of each row. So an image's tokens follow its size: base + rows x (columns + 1) of the unpadded map.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from engine.models.vision.encoder_base import tower_and_projector_name
from engine.models.vision.llava import LlavaImageEncoder


def best_resolution(height: int, width: int, pinpoints: list[tuple[int, int]]) -> tuple[int, int]:
    """The (height, width) among ``pinpoints`` that keeps most of an image's pixels when it is scaled to fit, and
    of those the one that wastes least (LLaVA-NeXT's rule)."""
    best, most_kept, least_wasted = None, -1, float("inf")
    for pin_height, pin_width in pinpoints:
        scale = min(pin_width / width, pin_height / height)
        kept = min(int(width * scale) * int(height * scale), width * height)
        wasted = pin_width * pin_height - kept
        if kept > most_kept or (kept == most_kept and wasted < least_wasted):
            best, most_kept, least_wasted = (pin_height, pin_width), kept, wasted
    return best


def unpadded_rows_and_columns(height: int, width: int, rows: int, columns: int) -> tuple[int, int]:
    """The feature map of ``rows`` x ``columns`` features that an image of ``height`` x ``width`` was padded into,
    with the padding (centered on the short side) cut off."""
    if width / height > columns / rows:
        kept = int(round(height * (columns / width), 7))
        return rows - (rows - kept) // 2 * 2, columns
    kept = int(round(width * (rows / height), 7))
    return rows, columns - (columns - kept) // 2 * 2


class LlavaNextImageEncoder(LlavaImageEncoder):
    family = "LLaVA-NeXT"
    # An image's tokens follow its size (the encoder is the tiles' fixed size, but the image is not).
    image_size = None

    def __init__(self, raw: dict[str, Any]) -> None:
        super().__init__(raw)
        if self.tokens_per_image != self.vision_tower.embeddings.num_patches:
            raise ValueError(f"config.json: {self.family}'s features are laid out as a grid of patches; "
                             "vision_feature_select_strategy must drop the class token ('default' for a CLIP tower, "
                             "'full' for SigLIP's, which has none)")
        pinpoints = raw.get("image_grid_pinpoints")
        if not isinstance(pinpoints, list) or not pinpoints or any(
                not isinstance(pin, (list, tuple)) or len(pin) != 2 for pin in pinpoints):
            raise ValueError(f"config.json: image_grid_pinpoints must be a list of [height, width], got {pinpoints!r}")
        self.pinpoints = [(int(height), int(width)) for height, width in pinpoints]
        self.tile = self.vision_tower.embeddings.image_size
        if any(height % self.tile or width % self.tile for height, width in self.pinpoints):
            raise ValueError(f"config.json: every image_grid_pinpoints entry must be a multiple of the tower's "
                             f"{self.tile}-pixel tiles, got {pinpoints!r}")
        self.patches = int(round(self.vision_tower.embeddings.num_patches ** 0.5))  # a tile's patches a side
        self.image_newline = nn.Parameter(torch.empty(self.multi_modal_projector.linear_2.out_features))

    def grid(self, height: int, width: int) -> tuple[int, int]:
        """(rows, columns) of tiles of an image of ``height`` x ``width`` pixels."""
        pin_height, pin_width = best_resolution(height, width, self.pinpoints)
        return pin_height // self.tile, pin_width // self.tile

    def feature_map(self, height: int, width: int) -> tuple[int, int]:
        """(rows, columns) of the grid's feature map of an image of ``height`` x ``width`` pixels, unpadded."""
        grid_rows, grid_columns = self.grid(height, width)
        return unpadded_rows_and_columns(height, width, grid_rows * self.patches, grid_columns * self.patches)

    def tokens_of(self, height: int, width: int) -> int:
        rows, columns = self.feature_map(height, width)
        return self.patches ** 2 + rows * (columns + 1)

    def split_processed(self, processed) -> list[tuple[tuple[torch.Tensor, tuple[int, int]], int]]:
        """The image processor's output -> per image ((its tiles [base + grid, 3, S, S], its size), tokens)."""
        pixels = processed["pixel_values"].to(torch.float32)
        if tuple(pixels.shape[-2:]) != (self.tile, self.tile):
            raise ValueError(f"the image processor makes {tuple(pixels.shape[-2:])} tiles, the vision tower takes "
                             f"{self.tile}x{self.tile}")
        items = []
        for index, (height, width) in enumerate(processed["image_sizes"].tolist()):
            rows, columns = self.grid(height, width)
            tiles = (pixels[index] if pixels.dim() == 5 else pixels)[:1 + rows * columns]
            items.append(((tiles, (int(height), int(width))), self.tokens_of(height, width)))
        if pixels.dim() == 4 and len(items) > 1:
            raise ValueError("the image processor's tiles of several images came unbatched")
        return items

    def encode(self, items: list) -> list[torch.Tensor]:
        """Each image's tiles -> its embeddings (module docstring); every tile of the step in one batch."""
        weight = self.multi_modal_projector.linear_1.weight
        tiles = torch.cat([tiles for tiles, _ in items]).to(weight.device, weight.dtype)
        features = torch.split(self(tiles), [len(tiles) for tiles, _ in items])
        return [self.pack(image, size) for image, (_, size) in zip(features, items)]

    def pack(self, features: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        """One image's [base + grid tiles, patches^2, hidden] -> its embeddings [tokens, hidden]."""
        grid_rows, grid_columns = self.grid(*size)
        patches, hidden = self.patches, features.shape[-1]
        grid = features[1:].view(grid_rows, grid_columns, patches, patches, hidden)
        grid = grid.permute(0, 2, 1, 3, 4).reshape(grid_rows * patches, grid_columns * patches, hidden)
        rows, columns = unpadded_rows_and_columns(*size, grid_rows * patches, grid_columns * patches)
        top, left = (grid.shape[0] - rows) // 2, (grid.shape[1] - columns) // 2
        grid = self.resample(grid[top:top + rows, left:left + columns])
        newlines = self.image_newline.to(grid.dtype).expand(grid.shape[0], 1, hidden)
        return torch.cat([features[0], torch.cat([grid, newlines], dim=1).reshape(-1, hidden)])

    def resample(self, grid: torch.Tensor) -> torch.Tensor:
        """The unpadded feature map [rows, columns, hidden] as the language model reads it (LLaVA-NeXT: as is)."""
        return grid

    def max_tokens(self, processor) -> int:
        """The tokens of the largest image the pinpoints hold: one of a pinpoint's exact shape (nothing unpadded)."""
        return max(self.tokens_of(height, width) for height, width in self.pinpoints)

    def picture_size(self, tokens: int, processor) -> tuple[int, int] | None:
        """A picture of ``tokens`` tokens, searched among sizes in steps of a patch up to the largest pinpoint,
        the most square first (None: none gives it)."""
        step = self.tile // self.patches
        most = max(max(pin) for pin in self.pinpoints)
        sizes = [(height, width) for height in range(step, most + 1, step) for width in range(step, most + 1, step)]
        sizes.sort(key=lambda size: (abs(size[0] - size[1]), size))
        return next((size for size in sizes if self.tokens_of(*size) == tokens), None)

    @staticmethod
    def own_name(name: str) -> str | None:
        if name.removeprefix("model.") == "image_newline":
            return "image_newline"
        return tower_and_projector_name(name)
