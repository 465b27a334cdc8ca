"""Qwen2.5-VL's image path: Qwen2-VL's vision transformer (engine/models/vision/qwen2_vl.py) with RMSNorms, gated
MLPs, and windowed attention in most blocks.

The patches of each image are reordered so that each window of ``window_size`` pixels (112: 4 x 4 merged blocks of
2 x 2 patches) is contiguous; the blocks named in ``fullatt_block_indexes`` attend over the whole image, the others
within a window only; the merged embeddings are put back in the image's row-major order after the merger. The
language model's side (M-RoPE, images' token counts) is Qwen2-VL's.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.layers import RMSNorm
from engine.models.vision.clip_vision import vision_activation
from engine.models.vision.qwen2_vl import Qwen2PatchMerger, Qwen2VisionBlock, Qwen2VisionTower, Qwen2VLImageEncoder


def _rms_norm(size: int) -> nn.Module:
    return RMSNorm(size, 1e-6)


class GatedVisionMLP(nn.Module):
    def __init__(self, dim: int, hidden_dim: int, activation, bias: bool = True) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden_dim, bias=bias)
        self.up_proj = nn.Linear(dim, hidden_dim, bias=bias)
        self.down_proj = nn.Linear(hidden_dim, dim, bias=bias)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.activation(self.gate_proj(x)) * self.up_proj(x))


def window_order(grids: list[tuple[int, int, int]], merge: int, window: int) -> tuple[torch.Tensor, list[int]]:
    """(each merged block's index in window order, the windows' lengths in patches) over every image, images in
    turn; ``window`` is in merged blocks a side."""
    order, lengths, offset = [], [], 0
    for frames, rows, columns in grids:
        rows, columns = rows // merge, columns // merge
        index = torch.arange(frames * rows * columns).reshape(frames, rows, columns)
        pad_rows, pad_columns = window - rows % window, window - columns % window
        padded = F.pad(index, (0, pad_columns, 0, pad_rows), value=-1)
        windows_down, windows_across = (rows + pad_rows) // window, (columns + pad_columns) // window
        padded = padded.reshape(frames, windows_down, window, windows_across, window).permute(0, 1, 3, 2, 4)
        padded = padded.reshape(-1, window * window)
        for cells in padded:
            kept = cells[cells >= 0]
            if len(kept):
                order.append(kept + offset)
                lengths.append(len(kept) * merge * merge)
        offset += frames * rows * columns
    return torch.cat(order), lengths


class Qwen25VisionTower(Qwen2VisionTower):
    def __init__(self, vision: dict[str, Any], out_dim: int) -> None:
        super().__init__(vision, out_dim)
        self.full_attention_blocks = set(int(index) for index in vision.get("fullatt_block_indexes", []))
        self.window = int(vision.get("window_size", 112)) // self.merge // int(vision.get("patch_size", 14))

    @staticmethod
    def width(vision: dict[str, Any]) -> int:
        return int(vision.get("hidden_size", 1280))

    def make_block(self, vision: dict[str, Any], dim: int, heads: int) -> nn.Module:
        activation = vision_activation(vision.get("hidden_act", "silu"), "vision_config.hidden_act")
        return Qwen2VisionBlock(dim, heads, GatedVisionMLP(dim, int(vision.get("intermediate_size", 3420)), activation),
                                norm=_rms_norm)

    def make_merger(self, vision: dict[str, Any], out_dim: int, dim: int) -> nn.Module:
        return Qwen2PatchMerger(out_dim, dim, self.merge, norm=_rms_norm)

    def forward(self, patches: torch.Tensor, grids: list[tuple[int, int, int]]) -> torch.Tensor:
        unit = self.merge * self.merge
        order, window_lengths = window_order(grids, self.merge, self.window)
        order = order.to(patches.device)

        def in_window_order(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.reshape(-1, unit, *tensor.shape[1:])[order].reshape(tensor.shape)

        cos, sin = (in_window_order(part) for part in self.rotary(grids, patches.device))
        image_lengths = [frames * rows * columns for frames, rows, columns in grids]
        hidden_states = in_window_order(self.patch_embed(patches))
        for index, block in enumerate(self.blocks):
            lengths = image_lengths if index in self.full_attention_blocks else window_lengths
            hidden_states = block(hidden_states, cos, sin, lengths)
        return self.merger(hidden_states)[torch.argsort(order)]


class Qwen25VLImageEncoder(Qwen2VLImageEncoder):
    """The tower and merger of a ``Qwen2_5_VLForConditionalGeneration`` checkpoint."""
    family = "Qwen2.5-VL"
    tower_class = Qwen25VisionTower
