"""InternVL's image path (InternVL3 / 3.5 in transformers' layout, ``InternVLForConditionalGeneration``, the Hub's
"-hf" checkpoints): InternViT over 448-pixel tiles, a 2 x 2 pixel shuffle and a two-layer projector.

The image processor (GOT-OCR2's) cuts an image into a grid of tiles whose shape is the closest to the image's
aspect ratio (between ``min_patches`` and ``max_patches`` tiles), plus a thumbnail of the whole image when there is
more than one; each tile is ``image_seq_length`` tokens (448 / 14 = 32 patches a side, shuffled 2 x 2 into 16 x 16 =
256). So an image's tokens follow its shape: 256 x (tiles + 1), or 256 for one tile.

InternViT is a pre-norm ViT with a class token (dropped before the shuffle), learned absolute positions, optional
RMSNorms on q and k (over all heads together), and per-channel layer scales (``lambda_1``, ``lambda_2``) on both
residual branches; LayerNorm or RMSNorm blocks as ``norm_type`` says. In a prompt an image is the image token
(``<IMG_CONTEXT>``) once, which becomes ``<img>``, its tokens, ``</img>``: the two marks' ids are the tokenizer's, so
without one images are refused by name.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.layers import RMSNorm
from engine.models.vision.clip_vision import ClipMLP, vision_activation
from engine.models.vision.encoder_base import ImageEncoder


def _pair(value, field: str) -> int:
    """A square size given as one number or [height, width]."""
    if isinstance(value, (list, tuple)):
        if len(value) != 2 or value[0] != value[1]:
            raise ValueError(f"config.json: vision_config.{field} must be square, got {value!r}")
        value = value[0]
    return int(value)


class InternVisionAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, bias: bool, qk_norm: bool, eps: float) -> None:
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(hidden, hidden, bias=bias)
        self.k_proj = nn.Linear(hidden, hidden, bias=bias)
        self.v_proj = nn.Linear(hidden, hidden, bias=bias)
        self.projection_layer = nn.Linear(hidden, hidden)
        self.q_norm = RMSNorm(hidden, eps) if qk_norm else nn.Identity()
        self.k_norm = RMSNorm(hidden, eps) if qk_norm else nn.Identity()

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        tiles, tokens, hidden = hidden_states.shape

        def heads(x: torch.Tensor) -> torch.Tensor:
            return x.view(tiles, tokens, self.heads, hidden // self.heads).transpose(1, 2)

        # Every token of a tile sees every other: the encoder is not causal.
        attended = F.scaled_dot_product_attention(heads(self.q_norm(self.q_proj(hidden_states))),
                                                  heads(self.k_norm(self.k_proj(hidden_states))),
                                                  heads(self.v_proj(hidden_states)))
        return self.projection_layer(attended.transpose(1, 2).reshape(tiles, tokens, hidden))


class InternVisionLayer(nn.Module):
    def __init__(self, vision: dict[str, Any], hidden: int, heads: int, eps: float, norm) -> None:
        super().__init__()
        self.attention = InternVisionAttention(hidden, heads, bool(vision.get("attention_bias", False)),
                                               bool(vision.get("use_qk_norm", False)), eps)
        self.mlp = ClipMLP(hidden, int(vision.get("intermediate_size", 4096)),
                                   vision_activation(vision.get("hidden_act", "gelu"), "vision_config.hidden_act"))
        self.layernorm_before = norm(hidden)
        self.layernorm_after = norm(hidden)
        self.lambda_1 = nn.Parameter(torch.empty(hidden))
        self.lambda_2 = nn.Parameter(torch.empty(hidden))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = hidden_states + self.lambda_1 * self.attention(self.layernorm_before(hidden_states))
        return hidden_states + self.lambda_2 * self.mlp(self.layernorm_after(hidden_states))


class InternVisionEmbeddings(nn.Module):
    def __init__(self, hidden: int, image_size: int, patch_size: int, channels: int) -> None:
        super().__init__()
        self.image_size = image_size
        self.cls_token = nn.Parameter(torch.empty(1, 1, hidden))
        self.patch_embeddings = nn.Module()
        self.patch_embeddings.projection = nn.Conv2d(channels, hidden, kernel_size=patch_size, stride=patch_size)
        self.patches_per_side = image_size // patch_size
        self.position_embeddings = nn.Parameter(torch.empty(1, self.patches_per_side ** 2 + 1, hidden))

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[tiles, channels, H, W] -> [tiles, 1 + patches, hidden]."""
        projection = self.patch_embeddings.projection
        patches = projection(pixel_values.to(projection.weight.dtype)).flatten(2).transpose(1, 2)
        embeddings = torch.cat([self.cls_token.expand(patches.shape[0], -1, -1), patches], dim=1)
        return embeddings + self.position_embeddings


class InternVisionModel(nn.Module):
    def __init__(self, vision: dict[str, Any]) -> None:
        super().__init__()
        hidden, heads = int(vision.get("hidden_size", 1024)), int(vision.get("num_attention_heads", 16))
        if hidden % heads:
            raise ValueError(f"config.json: vision_config.hidden_size {hidden} is not a multiple of "
                             f"vision_config.num_attention_heads {heads}")
        eps = float(vision.get("layer_norm_eps", 1e-6))
        norm_type = vision.get("norm_type", "layer_norm")
        norms = {"layer_norm": lambda size: nn.LayerNorm(size, eps=eps), "rms_norm": lambda size: RMSNorm(size, eps)}
        if norm_type not in norms:
            raise ValueError(f"config.json: vision_config.norm_type must be one of {sorted(norms)}, got {norm_type!r}")
        if not vision.get("use_absolute_position_embeddings", True) or vision.get("use_mask_token", False):
            raise ValueError("config.json: InternVL's vision_config must use absolute position embeddings and no "
                             "mask token")
        self.embeddings = InternVisionEmbeddings(hidden, _pair(vision.get("image_size", 448), "image_size"),
                                                 _pair(vision.get("patch_size", 14), "patch_size"),
                                                 int(vision.get("num_channels", 3)))
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList(InternVisionLayer(vision, hidden, heads, eps, norms[norm_type])
                                           for _ in range(int(vision.get("num_hidden_layers", 24))))
        # Mean pooling (InternVL's default) leaves the last layer's output unnormed.
        self.layernorm = nn.Identity() if vision.get("use_mean_pooling", True) else nn.LayerNorm(hidden, eps=eps)

    def hidden_states(self, pixel_values: torch.Tensor, deepest: int) -> list[torch.Tensor]:
        """The embeddings' output (index 0) and each layer's up to layer ``deepest`` (1-based); the last layer's
        through the final norm, as transformers' ``last_hidden_state``."""
        states = [self.embeddings(pixel_values)]
        for layer in self.encoder.layer[:deepest]:
            states.append(layer(states[-1]))
        if deepest == len(self.encoder.layer):
            states[-1] = self.layernorm(states[-1])
        return states


class InternVLProjector(nn.Module):
    def __init__(self, in_features: int, out_features: int, activation) -> None:
        super().__init__()
        self.layer_norm = nn.LayerNorm(in_features)
        self.linear_1 = nn.Linear(in_features, out_features)
        self.linear_2 = nn.Linear(out_features, out_features)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.activation(self.linear_1(self.layer_norm(x))))


def pixel_shuffle(features: torch.Tensor, side: int, factor: int) -> torch.Tensor:
    """[tiles, side x side, channels] -> [tiles, (side / factor)^2, channels x factor^2]: each factor x factor block
    of patches joined into one token, as transformers' InternVL orders the features (columns first, then rows)."""
    tiles, _, channels = features.shape
    grid = features.view(tiles, side, side // factor, channels * factor)
    grid = grid.permute(0, 2, 1, 3).reshape(tiles, side // factor, side // factor, channels * factor * factor)
    return grid.permute(0, 2, 1, 3).reshape(tiles, -1, channels * factor * factor)


class InternVLImageEncoder(ImageEncoder):
    family = "InternVL"

    def __init__(self, raw: dict[str, Any]) -> None:
        super().__init__()
        vision = raw.get("vision_config") or {}
        self.vision_tower = InternVisionModel(vision)
        ratio = float(raw.get("downsample_ratio", 0.5))
        self.shuffle = round(1 / ratio)
        side = self.vision_tower.embeddings.patches_per_side
        if abs(self.shuffle * ratio - 1) > 1e-6 or side % self.shuffle:
            raise ValueError(f"config.json: downsample_ratio {ratio} must be 1 / n for an n that divides the tile's "
                             f"{side} patches a side")
        self.tokens_per_tile = (side // self.shuffle) ** 2
        strategy = raw.get("vision_feature_select_strategy", "default")
        if strategy != "default":
            raise ValueError("config.json: vision_feature_select_strategy must be 'default' (the class token "
                             f"dropped before the pixel shuffle), got {strategy!r}")
        layers = len(self.vision_tower.encoder.layer)
        layer = raw.get("vision_feature_layer", -1)
        if not isinstance(layer, int) or not -(layers + 1) <= layer <= layers:
            raise ValueError(f"config.json: vision_feature_layer must index the tower's {layers + 1} hidden states, "
                             f"got {layer!r}")
        self.feature_layer = layer % (layers + 1)
        hidden = int(vision.get("hidden_size", 1024))
        self.multi_modal_projector = InternVLProjector(
            hidden * self.shuffle ** 2, int((raw.get("text_config") or {}).get("hidden_size", 896)),
            vision_activation(raw.get("projector_hidden_act", "gelu"), "projector_hidden_act"))
        token = raw.get("image_token_id", raw.get("image_token_index"))
        if not isinstance(token, int):
            raise ValueError(f"config.json: an InternVL checkpoint needs image_token_id, got {token!r}")
        self.image_token_id = token
        # <img> and </img> around each image's tokens; their ids are the tokenizer's (attach_language_model).
        self.start_token_id: int | None = None
        self.end_token_id: int | None = None

    def attach_language_model(self, model, tokenizer, checkpoint) -> None:
        if tokenizer is None:
            return
        ids = tokenizer.convert_tokens_to_ids(["<img>", "</img>"])
        if any(not isinstance(token, int) or token == tokenizer.unk_token_id for token in ids):
            raise ValueError(f"model {str(checkpoint)!r}: its tokenizer has no <img> and </img> tokens")
        self.start_token_id, self.end_token_id = ids

    def placeholder_span(self, data, tokens: int) -> tuple[list[int], list[int], list[int]]:
        if self.start_token_id is None:
            raise ValueError("InternVL images need the checkpoint's tokenizer, whose <img> and </img> surround each "
                             "image; create the engine without skip_tokenizer_init")
        return [self.start_token_id], [self.image_token_id] * tokens, [self.end_token_id]

    def split_processed(self, processed) -> list[tuple[torch.Tensor, int]]:
        """The image processor's output -> per image (its tiles' pixels [tiles, 3, H, W], placeholder tokens)."""
        pixels = processed["pixel_values"].to(torch.float32)
        size = self.vision_tower.embeddings.image_size
        if tuple(pixels.shape[-2:]) != (size, size):
            raise ValueError(f"the image processor makes {tuple(pixels.shape[-2:])} tiles, the vision tower takes "
                             f"{size}x{size}")
        counts = [int(count) for count in torch.as_tensor(processed["num_patches"]).flatten().tolist()]
        return [(tiles, len(tiles) * self.tokens_per_tile) for tiles in torch.split(pixels, counts)]

    def encode(self, items: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each image's tiles -> its embeddings [tiles x tokens_per_tile, hidden], tile by tile; every tile of the
        step in one batch."""
        weight = self.multi_modal_projector.linear_1.weight
        tiles = torch.cat(items).to(weight.device, weight.dtype)
        features = self.vision_tower.hidden_states(tiles, self.feature_layer)[self.feature_layer][:, 1:]
        side = self.vision_tower.embeddings.patches_per_side
        embeddings = self.multi_modal_projector(pixel_shuffle(features, side, self.shuffle)).flatten(0, 1)
        return list(torch.split(embeddings, [len(item) * self.tokens_per_tile for item in items]))

    def max_tokens(self, processor) -> int:
        """The tokens of the processor's most tiles: ``max_patches`` and a thumbnail."""
        most = int(getattr(processor, "max_patches", 12) or 1)
        return self.tokens_per_tile * (most + 1 if most > 1 and getattr(processor, "crop_to_patches", False) else 1)

    def picture_size(self, tokens: int, processor) -> tuple[int, int] | None:
        """A picture of ``tokens`` tokens: a grid of tiles of exactly its aspect ratio, rows x columns as near square
        as the count allows (None: no grid gives it)."""
        if tokens % self.tokens_per_tile:
            return None
        count = tokens // self.tokens_per_tile
        side = self.vision_tower.embeddings.image_size
        if count == 1:
            return side, side
        tiles = count - 1  # the thumbnail
        if tiles < 2:
            return None
        rows = max(divisor for divisor in range(1, int(tiles ** 0.5) + 1) if tiles % divisor == 0)
        return rows * side, tiles // rows * side

    @staticmethod
    def own_name(name: str) -> str | None:
        name = name.removeprefix("model.")
        return name if name.startswith(("vision_tower.", "multi_modal_projector.")) else None
