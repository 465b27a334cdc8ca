"""Qwen2-VL's image path: its vision transformer at the image's own resolution and the merger into the language
model (transformers' ``Qwen2VisionTransformerPretrainedModel``).

The image processor cuts an image, resized to multiples of 28 pixels, into 14 x 14 patches (each repeated over two
frames: ``temporal_patch_size``), flattened in blocks of 2 x 2 neighbours; ``grid`` is its (frames / 2, rows, columns)
of patches. A strided 3-d convolution embeds each patch, a 2-d RoPE turns each head by the patch's row (first half)
and column (second half), pre-norm blocks attend among one image's patches only (quick-GELU MLPs), and the merger
joins each block of four neighbours into one embedding of the language model: rows x columns / 4 placeholder tokens
an image, as many as its size gives. The language model reads those tokens at 3-d positions (engine/runner/
mrope_positions.py), with RoPE over three sections of each head (``mrope_section``).

Parameter names follow the checkpoint's (``visual.blocks.N.attn.qkv``, ``visual.merger.mlp.0``...).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.rotary_embedding import rotate_half
from engine.models.vision.clip_vision import vision_activation
from engine.models.vision.encoder_base import ImageEncoder


def vision_positions(grid: tuple[int, int, int], merge: int) -> torch.Tensor:
    """Each patch's (row, column) in the processor's order (blocks of merge x merge neighbours), repeated per frame."""
    frames, rows, columns = grid
    row_ids = torch.arange(rows).view(rows // merge, merge, 1, 1).expand(-1, -1, columns // merge, merge)
    column_ids = torch.arange(columns).view(1, 1, columns // merge, merge).expand(rows // merge, merge, -1, -1)
    positions = torch.stack([row_ids.transpose(1, 2).flatten(), column_ids.transpose(1, 2).flatten()], dim=-1)
    return positions.repeat(frames, 1)


def attend_per_image(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """q, k, v [tokens, heads, head_dim] of consecutive images (or windows) of ``lengths`` tokens -> each token's
    attention over its own image's tokens (no mask within it: a vision encoder is not causal)."""
    outputs, start = [], 0
    for length in lengths:
        piece = slice(start, start + length)
        outputs.append(F.scaled_dot_product_attention(q[piece].transpose(0, 1), k[piece].transpose(0, 1),
                                                      v[piece].transpose(0, 1)).transpose(0, 1))
        start += length
    return torch.cat(outputs)


class Qwen2VisionAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                lengths: list[int]) -> torch.Tensor:
        tokens = hidden_states.shape[0]
        q, k, v = self.qkv(hidden_states).view(tokens, 3, self.num_heads, -1).unbind(1)
        # RoPE in float32, as transformers turns them.
        q = (q.float() * cos + rotate_half(q.float()) * sin).to(v.dtype)
        k = (k.float() * cos + rotate_half(k.float()) * sin).to(v.dtype)
        return self.proj(attend_per_image(q, k, v, lengths).reshape(tokens, -1))


class Qwen2VisionMLP(nn.Module):
    def __init__(self, dim: int, hidden_dim: int, activation) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation(self.fc1(x)))


class Qwen2VisionBlock(nn.Module):
    def __init__(self, dim: int, num_heads: int, mlp: nn.Module, norm=None) -> None:
        """``mlp``: the block's MLP; ``norm``: its norms' class (LayerNorm for Qwen2-VL, RMSNorm for Qwen2.5-VL)."""
        super().__init__()
        norm = norm or (lambda size: nn.LayerNorm(size, eps=1e-6))
        self.norm1 = norm(dim)
        self.norm2 = norm(dim)
        self.attn = Qwen2VisionAttention(dim, num_heads)
        self.mlp = mlp

    def forward(self, hidden_states, cos, sin, lengths):
        hidden_states = hidden_states + self.attn(self.norm1(hidden_states), cos, sin, lengths)
        return hidden_states + self.mlp(self.norm2(hidden_states))


class Qwen2PatchEmbed(nn.Module):
    def __init__(self, patch_size: int, temporal_patch_size: int, in_channels: int, dim: int,
                 bias: bool = False) -> None:
        super().__init__()
        self.shape = (in_channels, temporal_patch_size, patch_size, patch_size)
        self.proj = nn.Conv3d(in_channels, dim, kernel_size=self.shape[1:], stride=self.shape[1:], bias=bias)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        weight = self.proj.weight
        return self.proj(patches.view(-1, *self.shape).to(weight.dtype)).view(patches.shape[0], -1)


class Qwen2PatchMerger(nn.Module):
    def __init__(self, out_dim: int, dim: int, merge: int, norm=None) -> None:
        super().__init__()
        self.merged = dim * merge * merge
        self.ln_q = (norm or (lambda size: nn.LayerNorm(size, eps=1e-6)))(dim)
        self.mlp = nn.Sequential(nn.Linear(self.merged, self.merged), nn.GELU(), nn.Linear(self.merged, out_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.ln_q(x).view(-1, self.merged))


class Qwen2VisionTower(nn.Module):
    def __init__(self, vision: dict[str, Any], out_dim: int) -> None:
        super().__init__()
        dim, heads = self.width(vision), int(vision.get("num_heads", 16))
        if dim % heads or (dim // heads) % 4:
            raise ValueError(f"config.json: vision_config.embed_dim {dim} must split into num_heads {heads} heads "
                             "of a multiple of 4 features (a 2-d RoPE over each half)")
        self.merge = int(vision.get("spatial_merge_size", 2))
        self.patch_embed = self.make_patch_embed(vision, dim)
        self.blocks = nn.ModuleList(self.make_block(vision, dim, heads) for _ in range(int(vision.get("depth", 32))))
        self.merger = self.make_merger(vision, out_dim, dim)
        rope = vision.get("rope_parameters") or {}
        self.quarter = dim // heads // 4  # each of a head's two halves turns by row or column at these frequencies
        self.theta = float(rope.get("rope_theta", vision.get("rope_theta", 10000.0)))

    @staticmethod
    def width(vision: dict[str, Any]) -> int:
        return int(vision.get("embed_dim", 1280))

    def make_patch_embed(self, vision: dict[str, Any], dim: int) -> nn.Module:
        return Qwen2PatchEmbed(int(vision.get("patch_size", 14)), int(vision.get("temporal_patch_size", 2)),
                               int(vision.get("in_channels", 3)), dim)

    def make_block(self, vision: dict[str, Any], dim: int, heads: int) -> nn.Module:
        activation = vision_activation(vision.get("hidden_act", "quick_gelu"), "vision_config.hidden_act")
        return Qwen2VisionBlock(dim, heads, Qwen2VisionMLP(dim, int(dim * float(vision.get("mlp_ratio", 4))),
                                                           activation))

    def make_merger(self, vision: dict[str, Any], out_dim: int, dim: int) -> nn.Module:
        return Qwen2PatchMerger(out_dim, dim, self.merge)

    def rotary(self, grids: list[tuple[int, int, int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [patches, 1, head_dim] of every patch's row and column."""
        positions = torch.cat([vision_positions(grid, self.merge) for grid in grids]).to(device)
        inv_freq = 1.0 / self.theta ** (torch.arange(self.quarter, dtype=torch.float32, device=device)
                                         / self.quarter)
        freqs = positions[..., None].float() * inv_freq  # [patches, 2, head_dim / 4]
        freqs = freqs.flatten(1)
        angles = torch.cat([freqs, freqs], dim=-1)[:, None, :]
        return angles.cos(), angles.sin()

    def forward(self, patches: torch.Tensor, grids: list[tuple[int, int, int]]) -> torch.Tensor:
        """Every image's patches, concatenated -> their merged embeddings, concatenated."""
        cos, sin = self.rotary(grids, patches.device)
        lengths = [frames * rows * columns for frames, rows, columns in grids]
        hidden_states = self.patch_embed(patches)
        for block in self.blocks:
            hidden_states = block(hidden_states, cos, sin, lengths)
        return self.merger(hidden_states)


class Qwen2VLImageEncoder(ImageEncoder):
    """The tower and merger of a ``Qwen2VLForConditionalGeneration`` checkpoint; an item's data is the processor's
    (patches, grid) for one image."""
    family = "Qwen2-VL"
    tower_class = Qwen2VisionTower
    # M-RoPE's sections: consecutive (Qwen2-VL, 2.5-VL) or interleaved feature by feature (Qwen3-VL).
    mrope_interleaved = False

    def __init__(self, raw: dict[str, Any]) -> None:
        super().__init__()
        text = raw.get("text_config") or raw
        vision = raw.get("vision_config") or {}
        self.visual = self.tower_class(vision, int(vision.get("out_hidden_size") or text.get("hidden_size", 3584)))
        token = raw.get("image_token_id", (raw.get("text_config") or {}).get("image_token_id"))
        if not isinstance(token, int):
            raise ValueError(f"config.json: a Qwen2-VL checkpoint needs image_token_id, got {token!r}")
        self.image_token_id = token
        rope = next((text.get(key) for key in ("rope_parameters", "rope_scaling") if isinstance(text.get(key), dict)
                     and "mrope_section" in text[key]), None)
        if rope is None:
            raise ValueError("config.json: a Qwen2-VL checkpoint needs rope_parameters.mrope_section (M-RoPE)")
        # The language model's RoPE sections (temporal, height, width) of each head's rotary half.
        self.mrope_section = [int(size) for size in rope["mrope_section"]]
        self.spatial_merge_size = self.visual.merge

    def tokens_of(self, grid: tuple[int, int, int]) -> int:
        frames, rows, columns = grid
        return frames * rows * columns // self.spatial_merge_size ** 2

    def encode(self, items: list) -> list[torch.Tensor]:
        """Each item's (patches, grid) -> its embeddings [tokens, hidden]; every image of the step in one pass."""
        weight = self.visual.patch_embed.proj.weight
        patches = torch.cat([patches for patches, _ in items]).to(weight.device, weight.dtype)
        grids = [tuple(grid) for _, grid in items]
        embeddings = self.visual(patches, grids)
        return list(torch.split(embeddings, [self.tokens_of(grid) for grid in grids]))

    def max_tokens(self, processor) -> int:
        """The tokens of the processor's largest image (``size.longest_edge`` or ``max_pixels``: an area)."""
        size = getattr(processor, "size", None) or {}
        most = (size.get("longest_edge") if hasattr(size, "get") else None) or getattr(processor, "max_pixels", None)
        if not most:
            raise ValueError("its image processor names no largest image (size.longest_edge or max_pixels)")
        side = self.token_side(processor)
        return int(most) // (side * side)

    def token_side(self, processor) -> int:
        """Pixels a side of one token's block of merge x merge patches."""
        patch = getattr(processor, "patch_size", None) or 14
        return int(patch) * self.spatial_merge_size

    def picture_size(self, tokens: int, processor) -> tuple[int, int]:
        """A picture the processor keeps at ``tokens`` tokens: rows x columns of blocks, as near square as it allows."""
        rows = max(divisor for divisor in range(1, int(tokens ** 0.5) + 1) if tokens % divisor == 0)
        side = self.token_side(processor)
        return rows * side, tokens // rows * side

    def split_processed(self, processed) -> list[tuple[tuple[torch.Tensor, tuple[int, int, int]], int]]:
        """The image processor's output -> per image ((patches, grid), placeholder tokens)."""
        grids = [tuple(int(value) for value in grid) for grid in processed["image_grid_thw"].tolist()]
        pieces = torch.split(processed["pixel_values"].to(torch.float32), [t * h * w for t, h, w in grids])
        return [((piece, grid), self.tokens_of(grid)) for piece, grid in zip(pieces, grids)]

    @staticmethod
    def own_name(name: str) -> str | None:
        name = name.removeprefix("model.")
        return name if name.startswith("visual.") else None
