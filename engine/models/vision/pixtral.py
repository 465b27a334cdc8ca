"""Mistral 3's image path (Mistral Small 3.1+: ``Mistral3ForConditionalGeneration``): a Pixtral vision transformer at
each image's own resolution, and a projector that merges each 2 x 2 block of patches into one token.

The processor resizes an image to fit ``longest_edge`` in multiples of the patch (14 pixels). The tower embeds each
patch (a strided convolution, RMSNorm), turns each head by the patch's row and column (a 2-d RoPE over interleaved
frequencies), and runs pre-norm blocks (RMSNorms, gated SiLU MLPs, no biases) with attention among one image's
patches only. The projector normalizes, concatenates each block of ``spatial_merge_size`` x ``spatial_merge_size``
patches (the last odd row or column dropped), maps it back to the tower's width, then through two linears to the
language model's.

In the prompt an image is a grid: each row of merged tokens is that many ``[IMG]`` tokens then ``[IMG_BREAK]``, the
last row ending in ``[IMG_END]`` instead. The engine's multimodal item spans the whole grid; the encoder's output for
it holds the image's embeddings at the ``[IMG]`` positions and the language model's own embeddings of the break and
end tokens at theirs, so the runner fills the whole span from one output (engine/runner/encoder_outputs.py) and the
language model reads exactly what transformers' reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.layers import RMSNorm
from engine.models.rotary_embedding import rotate_half
from engine.models.vision.clip_vision import vision_activation
from engine.models.vision.qwen2_5_vl import GatedVisionMLP
from engine.models.vision.qwen2_vl import attend_per_image
from engine.models.vision.encoder_base import ImageEncoder


class PixtralAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj = nn.Linear(dim, dim, bias=False)
        self.v_proj = nn.Linear(dim, dim, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, hidden_states, cos, sin, lengths):
        tokens = hidden_states.shape[0]

        def heads(x):
            return x.view(tokens, self.num_heads, -1)

        q, k, v = (heads(projection(hidden_states)) for projection in (self.q_proj, self.k_proj, self.v_proj))
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        return self.o_proj(attend_per_image(q, k, v, lengths).reshape(tokens, -1))


class PixtralLayer(nn.Module):
    def __init__(self, dim: int, heads: int, intermediate: int, activation) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(dim, 1e-5)
        self.attention = PixtralAttention(dim, heads)
        self.ffn_norm = RMSNorm(dim, 1e-5)
        self.feed_forward = GatedVisionMLP(dim, intermediate, activation, bias=False)

    def forward(self, hidden_states, cos, sin, lengths):
        hidden_states = hidden_states + self.attention(self.attention_norm(hidden_states), cos, sin, lengths)
        return hidden_states + self.feed_forward(self.ffn_norm(hidden_states))


class PixtralTransformer(nn.Module):
    def __init__(self, layers: list[PixtralLayer]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)


class PixtralTower(nn.Module):
    def __init__(self, vision: dict[str, Any]) -> None:
        super().__init__()
        dim, heads = int(vision.get("hidden_size", 1024)), int(vision.get("num_attention_heads", 16))
        self.patch_size = int(vision.get("patch_size", 14))
        self.head_dim = int(vision.get("head_dim") or dim // heads)
        rope = vision.get("rope_parameters") or {}
        self.theta = float(rope.get("rope_theta", vision.get("rope_theta", 10000.0)))
        self.patch_conv = nn.Conv2d(int(vision.get("num_channels", 3)), dim, kernel_size=self.patch_size,
                                    stride=self.patch_size, bias=False)
        self.ln_pre = RMSNorm(dim, 1e-5)
        activation = vision_activation(vision.get("hidden_act", "silu"), "vision_config.hidden_act")
        self.transformer = PixtralTransformer([PixtralLayer(dim, heads, int(vision.get("intermediate_size", 4096)),
                                                            activation)
                                               for _ in range(int(vision.get("num_hidden_layers", 24)))])

    def rotary(self, grids: list[tuple[int, int]], device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [patches, 1, head_dim]: the first quarter of each head turns by the patch's row at the even
        frequencies, the second by its column at the odd ones (then both halves again)."""
        inv_freq = 1.0 / self.theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=device)
                                         / self.head_dim)
        rows_then_columns = []
        for rows, columns in grids:
            row_ids, column_ids = torch.meshgrid(torch.arange(rows, device=device),
                                                 torch.arange(columns, device=device), indexing="ij")
            rows_then_columns.append(torch.stack([row_ids.flatten(), column_ids.flatten()], dim=-1))
        positions = torch.cat(rows_then_columns).float()
        freqs = torch.cat([positions[:, :1] * inv_freq[0::2], positions[:, 1:] * inv_freq[1::2]], dim=-1)
        angles = torch.cat([freqs, freqs], dim=-1)[:, None, :]
        return angles.cos(), angles.sin()

    def forward(self, images: list[torch.Tensor]) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        """Each image [channels, H, W] -> every image's patches' last hidden states, concatenated, and each image's
        (rows, columns) of patches."""
        embedded = [self.patch_conv(image[None].to(self.patch_conv.weight.dtype))[0] for image in images]
        grids = [(patches.shape[1], patches.shape[2]) for patches in embedded]
        hidden_states = self.ln_pre(torch.cat([patches.flatten(1).T for patches in embedded]))
        cos, sin = self.rotary(grids, hidden_states.device)
        lengths = [rows * columns for rows, columns in grids]
        for layer in self.transformer.layers:
            hidden_states = layer(hidden_states, cos, sin, lengths)
        return hidden_states, grids


class PatchMerger(nn.Module):
    def __init__(self, dim: int, merge: int) -> None:
        super().__init__()
        self.merge = merge
        self.merging_layer = nn.Linear(dim * merge * merge, dim, bias=False)

    def forward(self, features: torch.Tensor, grids: list[tuple[int, int]]) -> torch.Tensor:
        merged, start = [], 0
        for rows, columns in grids:
            grid = features[start:start + rows * columns].view(rows, columns, -1).permute(2, 0, 1)[None]
            blocks = F.unfold(grid, kernel_size=self.merge, stride=self.merge)  # [1, dim * merge^2, blocks]
            merged.append(blocks[0].T)
            start += rows * columns
        return self.merging_layer(torch.cat(merged))


class Mistral3Projector(nn.Module):
    def __init__(self, raw: dict[str, Any], vision_dim: int, text_dim: int, merge: int) -> None:
        super().__init__()
        text = raw.get("text_config") or {}
        bias = bool(raw.get("multimodal_projector_bias", False))
        self.norm = RMSNorm(vision_dim, float(text.get("rms_norm_eps", 1e-5)))
        self.patch_merger = PatchMerger(vision_dim, merge)
        self.linear_1 = nn.Linear(vision_dim, text_dim, bias=bias)
        self.linear_2 = nn.Linear(text_dim, text_dim, bias=bias)
        self.activation = vision_activation(raw.get("projector_hidden_act", "gelu"), "projector_hidden_act")

    def forward(self, features, grids):
        return self.linear_2(self.activation(self.linear_1(self.patch_merger(self.norm(features), grids))))


class Mistral3ImageEncoder(ImageEncoder):
    """An item's data is one image's pixels [channels, H, W] as the processor made them (unpadded)."""
    family = "Mistral 3"

    def __init__(self, raw: dict[str, Any]) -> None:
        super().__init__()
        vision = raw.get("vision_config") or {}
        if vision.get("model_type", "pixtral") != "pixtral":
            raise ValueError(f"config.json: vision_config.model_type {vision.get('model_type')!r} is not supported for "
                             "Mistral 3 images (a Pixtral tower is)")
        layer = raw.get("vision_feature_layer", -1)
        if layer not in (-1, int(vision.get("num_hidden_layers", 24))):
            raise ValueError(f"config.json: vision_feature_layer {layer!r} is not supported (the last layer's, -1, is)")
        self.merge = int(raw.get("spatial_merge_size", 2))
        self.vision_tower = PixtralTower(vision)
        text_dim = int((raw.get("text_config") or {}).get("hidden_size", 5120))
        self.multi_modal_projector = Mistral3Projector(raw, int(vision.get("hidden_size", 1024)), text_dim, self.merge)
        token = raw.get("image_token_index", raw.get("image_token_id"))
        if not isinstance(token, int):
            raise ValueError(f"config.json: a Mistral 3 checkpoint needs image_token_index, got {token!r}")
        self.image_token_id = token
        self.break_token_id: int | None = None
        self.end_token_id: int | None = None
        self._embed_tokens = None

    def attach_language_model(self, model, tokenizer, checkpoint: str | Path) -> None:
        """The ids of ``[IMG_BREAK]`` and ``[IMG_END]`` (the checkpoint's processor_config.json names them; its
        tokenizer gives their ids) and the language model's token embedding, for the grid's break and end rows.
        Without a tokenizer (skip_tokenizer_init) the engine serves text, and images are refused by name."""
        self._embed_tokens = model.embed_input_ids
        if tokenizer is None:
            return
        names = {"image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]"}
        path = Path(checkpoint) / "processor_config.json"
        if path.is_file():
            names.update({key: value for key, value in json.loads(path.read_text()).items() if key in names})
        ids = [tokenizer.convert_tokens_to_ids(names[key]) for key in ("image_break_token", "image_end_token")]
        if any(not isinstance(token, int) or token == tokenizer.unk_token_id for token in ids):
            raise ValueError(f"model {str(checkpoint)!r}: its tokenizer has no {list(names.values())} tokens")
        self.break_token_id, self.end_token_id = ids

    def grid_of(self, image: torch.Tensor) -> tuple[int, int]:
        """(rows, columns) of merged tokens of an image's pixels."""
        patch = self.vision_tower.patch_size
        return image.shape[1] // patch // self.merge, image.shape[2] // patch // self.merge

    def placeholder_ids(self, image: torch.Tensor, tokens: int | None = None) -> list[int]:
        """The image's span in the prompt: each row of [IMG] tokens then [IMG_BREAK], the last ending [IMG_END]."""
        if self.break_token_id is None:
            raise ValueError("Mistral 3 images need the checkpoint's tokenizer, whose ids mark their rows "
                             "([IMG_BREAK], [IMG_END]); create the engine without skip_tokenizer_init")
        rows, columns = self.grid_of(image)
        span = ([self.image_token_id] * columns + [self.break_token_id]) * rows
        span[-1] = self.end_token_id
        return span

    def token_side(self) -> int:
        return self.vision_tower.patch_size * self.merge

    def max_tokens(self, processor) -> int:
        """The span of the processor's largest image: ``longest_edge`` pixels a side, a row break per row."""
        size = getattr(processor, "size", None) or {}
        longest = size.get("longest_edge") if hasattr(size, "get") else None
        if not longest:
            raise ValueError("its image processor names no largest image (size.longest_edge)")
        side = int(longest) // self.token_side()
        return side * (side + 1)

    def picture_size(self, tokens: int, processor) -> tuple[int, int] | None:
        """A picture whose span is ``tokens``: rows x (columns + 1), as near square as it allows (None: none)."""
        shapes = [(rows, tokens // rows - 1) for rows in range(1, tokens + 1)
                  if tokens % rows == 0 and tokens // rows > 1]
        if not shapes:
            return None
        rows, columns = min(shapes, key=lambda shape: abs(shape[0] - shape[1]))
        return rows * self.token_side(), columns * self.token_side()

    def split_processed(self, processed) -> list[tuple[torch.Tensor, int]]:
        pixels, sizes = processed["pixel_values"].to(torch.float32), processed["image_sizes"].tolist()
        items = [pixels[index, :, :height, :width] for index, (height, width) in enumerate(sizes)]
        return [(image, len(self.placeholder_ids(image))) for image in items]

    def encode(self, items: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each image -> its span's embeddings: its merged tokens' at the [IMG] positions, the language model's own
        embeddings of [IMG_BREAK] / [IMG_END] at the end of each row."""
        features, grids = self.vision_tower(items)
        embeddings = self.multi_modal_projector(features, grids)
        device = embeddings.device
        marks = self._embed_tokens(torch.tensor([self.break_token_id, self.end_token_id], device=device))
        spans, start = [], 0
        for image in items:
            rows, columns = self.grid_of(image)
            tokens = embeddings[start:start + rows * columns].view(rows, columns, -1)
            ends = marks[0].expand(rows, 1, -1).clone()
            ends[-1, 0] = marks[1]
            spans.append(torch.cat([tokens, ends.to(tokens.dtype)], dim=1).reshape(rows * (columns + 1), -1))
            start += rows * columns
        return spans

    @staticmethod
    def own_name(name: str) -> str | None:
        name = name.removeprefix("model.")
        return name if name.startswith(("vision_tower.", "multi_modal_projector.")) else None
