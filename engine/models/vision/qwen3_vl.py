"""Qwen3-VL's image path: Qwen2-VL's vision transformer (engine/models/vision/qwen2_vl.py) with a learned position
table, and DeepStack: features of early blocks merged into extra embeddings that the language model adds to the
image tokens' hidden states after its first layers (transformers' ``Qwen3VLVisionModel``).

Against Qwen2-VL: 16-pixel patches embedded with a bias; a learned square table of positions (``pos_embed``,
``num_position_embeddings`` = side x side) resampled bilinearly (corners aligned) to each image's rows and columns and
added to the patch embeddings before the first block, beside the blocks' 2-d RoPE; LayerNorm blocks with plain
tanh-GELU MLPs (``linear_fc1``, ``linear_fc2``); after each block named in ``deepstack_visual_indexes`` a merger of
its own (norm after the 2 x 2 shuffle) turns the block's output into one more embedding per placeholder.

The encoder's output per image is [tokens, hidden x (1 + DeepStack levels)]: the embedding the placeholder takes,
then level 0, 1... side by side, so that the encoder cache, chunked prefill's slices and preemption treat it as one
tensor; engine/runner/encoder_outputs.py splits it for the language model (``deepstack_inputs``). The language model
turns its positions by interleaved M-RoPE (``mrope_interleaved``: engine/models/rotary_embedding.py).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.vision.clip_vision import vision_activation
from engine.models.vision.qwen2_vl import Qwen2PatchEmbed, Qwen2VisionBlock, Qwen2VisionTower, Qwen2VLImageEncoder


class Qwen3VisionMLP(nn.Module):
    def __init__(self, dim: int, hidden_dim: int, activation) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(dim, hidden_dim)
        self.linear_fc2 = nn.Linear(hidden_dim, dim)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(self.activation(self.linear_fc1(x)))


class Qwen3PatchMerger(nn.Module):
    """merge x merge neighbouring patches -> one embedding of the language model. The final merger normalizes each
    patch before joining them; DeepStack's (``after_shuffle``) normalize the joined vector."""

    def __init__(self, out_dim: int, dim: int, merge: int, after_shuffle: bool) -> None:
        super().__init__()
        self.merged = dim * merge * merge
        self.after_shuffle = after_shuffle
        self.norm = nn.LayerNorm(self.merged if after_shuffle else dim, eps=1e-6)
        self.linear_fc1 = nn.Linear(self.merged, self.merged)
        self.linear_fc2 = nn.Linear(self.merged, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x.view(-1, self.merged)) if self.after_shuffle else self.norm(x).view(-1, self.merged)
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))


class Qwen3VisionTower(Qwen2VisionTower):
    def __init__(self, vision: dict[str, Any], out_dim: int) -> None:
        super().__init__(vision, out_dim)
        dim = self.width(vision)
        positions = int(vision.get("num_position_embeddings", 2304))
        self.table_side = int(positions ** 0.5)
        if self.table_side ** 2 != positions:
            raise ValueError(f"config.json: vision_config.num_position_embeddings {positions} must be a square (a "
                             "side x side table of positions)")
        self.pos_embed = nn.Embedding(positions, dim)
        self.deepstack_blocks = [int(index) for index in vision.get("deepstack_visual_indexes", [8, 16, 24])]
        depth = len(self.blocks)
        if any(not 0 <= index < depth for index in self.deepstack_blocks):
            raise ValueError(f"config.json: vision_config.deepstack_visual_indexes {self.deepstack_blocks} must name "
                             f"blocks 0-{depth - 1}")
        self.deepstack_merger_list = nn.ModuleList(Qwen3PatchMerger(out_dim, dim, self.merge, after_shuffle=True)
                                                   for _ in self.deepstack_blocks)

    @staticmethod
    def width(vision: dict[str, Any]) -> int:
        return int(vision.get("hidden_size", 1152))

    def make_patch_embed(self, vision: dict[str, Any], dim: int) -> nn.Module:
        return Qwen2PatchEmbed(int(vision.get("patch_size", 16)), int(vision.get("temporal_patch_size", 2)),
                               int(vision.get("in_channels", 3)), dim, bias=True)

    def make_block(self, vision: dict[str, Any], dim: int, heads: int) -> nn.Module:
        activation = vision_activation(vision.get("hidden_act", "gelu_pytorch_tanh"), "vision_config.hidden_act")
        return Qwen2VisionBlock(dim, heads, Qwen3VisionMLP(dim, int(vision.get("intermediate_size", 4304)),
                                                           activation))

    def make_merger(self, vision: dict[str, Any], out_dim: int, dim: int) -> nn.Module:
        return Qwen3PatchMerger(out_dim, dim, self.merge, after_shuffle=False)

    def position_embeddings(self, grids: list[tuple[int, int, int]]) -> torch.Tensor:
        """[patches, dim]: the table resampled to each image's rows x columns (bilinear, corners aligned, as
        ``F.interpolate`` does), in the processor's patch order (blocks of merge x merge), repeated per frame."""
        side, merge = self.table_side, self.merge
        table = self.pos_embed.weight.view(side, side, -1).permute(2, 0, 1)[None].float()
        pieces = []
        for frames, rows, columns in grids:
            grid = F.interpolate(table, size=(rows, columns), mode="bilinear", align_corners=True)[0]
            grid = grid.view(-1, rows // merge, merge, columns // merge, merge).permute(1, 3, 2, 4, 0)
            pieces.append(grid.reshape(rows * columns, -1).repeat(frames, 1))
        return torch.cat(pieces).to(self.pos_embed.weight.dtype)

    def forward(self, patches: torch.Tensor, grids: list[tuple[int, int, int]]) -> torch.Tensor:
        """Every image's patches, concatenated -> [tokens, out_dim x (1 + levels)]: the merged embeddings, then each
        DeepStack level's, side by side."""
        cos, sin = self.rotary(grids, patches.device)
        lengths = [frames * rows * columns for frames, rows, columns in grids]
        hidden_states = self.patch_embed(patches) + self.position_embeddings(grids)
        levels = []
        for index, block in enumerate(self.blocks):
            hidden_states = block(hidden_states, cos, sin, lengths)
            if index in self.deepstack_blocks:
                levels.append(self.deepstack_merger_list[self.deepstack_blocks.index(index)](hidden_states))
        return torch.cat([self.merger(hidden_states), *levels], dim=-1)


class Qwen3VLImageEncoder(Qwen2VLImageEncoder):
    """The tower, merger and DeepStack mergers of a ``Qwen3VLForConditionalGeneration`` checkpoint."""
    family = "Qwen3-VL"
    tower_class = Qwen3VisionTower
    mrope_interleaved = True

    @property
    def deepstack_levels(self) -> int:
        return len(self.visual.deepstack_blocks)
