"""LLaVA's image path: a CLIP vision tower, one of its hidden layers, and a two-layer projector into the language
model's embedding space (transformers' ``LlavaForConditionalGeneration`` without its language model).

``vision_feature_layer`` picks the tower's layer (an index into its hidden states, -2 by default: the output of all
but the last layer; a list concatenates several along the features), ``vision_feature_select_strategy`` whether the
class token is dropped ("default") or kept ("full"). So an image of LLaVA-1.5 (336 pixels, patches of 14) is 576
embeddings, which fill the 576 placeholder tokens the processor puts in its place.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from engine.models.vision.clip_vision import ClipVisionTransformer, vision_activation
from engine.models.vision.encoder_base import ImageEncoder, tower_and_projector_name
from engine.models.vision.siglip_vision import SiglipVisionTransformer


class LlavaProjector(nn.Module):
    def __init__(self, in_features: int, out_features: int, activation, bias: bool) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(in_features, out_features, bias=bias)
        self.linear_2 = nn.Linear(out_features, out_features, bias=bias)
        self.activation = activation

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.activation(self.linear_1(features)))


# The towers a LLaVA-family checkpoint's vision_config may name: CLIP (LLaVA-1.5, NeXT) or SigLIP (OneVision).
TOWERS = {"clip_vision_model": ClipVisionTransformer, "siglip_vision_model": SiglipVisionTransformer}


class LlavaImageEncoder(ImageEncoder):
    family = "LLaVA"
    # transformers' LlavaConfig default (LLaVA-OneVision's is "full").
    default_strategy = "default"

    def __init__(self, raw: dict[str, Any]) -> None:
        super().__init__()
        vision_config = raw.get("vision_config") or {}
        tower_type = vision_config.get("model_type", "clip_vision_model")
        if tower_type not in TOWERS:
            raise ValueError(f"config.json: vision_config.model_type {tower_type!r} is not supported for "
                             f"{self.family} images (the towers taken: {', '.join(TOWERS)})")
        strategy = raw.get("vision_feature_select_strategy", self.default_strategy)
        if strategy not in ("default", "full"):
            raise ValueError("config.json: vision_feature_select_strategy must be 'default' or 'full', got "
                             f"{strategy!r}")
        # "default" drops the tower's first feature (CLIP's class token; transformers drops SigLIP's first patch too).
        self.keep_class_token = strategy == "full"
        self.vision_tower = TOWERS[tower_type](vision_config)
        layers = raw.get("vision_feature_layer", -2)
        layers = [layers] if isinstance(layers, int) else list(layers)
        count = self.vision_tower.num_layers + 1  # the embeddings' output, then each layer's
        if not layers or any(not isinstance(layer, int) or not -count <= layer < count for layer in layers):
            raise ValueError(f"config.json: vision_feature_layer must index the tower's {count} hidden states "
                             f"(-{count} to {count - 1}), got {raw.get('vision_feature_layer')!r}")
        self.feature_layers = [layer % count for layer in layers]
        text_hidden = int((raw.get("text_config") or {}).get("hidden_size", 4096))
        self.multi_modal_projector = LlavaProjector(
            int(vision_config.get("hidden_size", 1024)) * len(layers), text_hidden,
            vision_activation(raw.get("projector_hidden_act", "gelu"), "projector_hidden_act"),
            bool(raw.get("multimodal_projector_bias", True)))
        token = raw.get("image_token_index", raw.get("image_token_id"))
        if not isinstance(token, int):
            raise ValueError(f"config.json: a LLaVA checkpoint needs image_token_index, got {token!r}")
        self.image_token_id = token

    @property
    def image_size(self) -> int:
        return self.vision_tower.embeddings.image_size

    @property
    def tokens_per_image(self) -> int:
        embeddings = self.vision_tower.embeddings
        return embeddings.num_patches + int(self.vision_tower.has_class_token) - int(not self.keep_class_token)

    def encode(self, items: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each item's pixels [channels, H, W] -> its embeddings [tokens_per_image, hidden]; one batch."""
        weight = self.multi_modal_projector.linear_1.weight
        return list(self(torch.stack(items).to(weight.device, weight.dtype)))

    def split_processed(self, processed) -> list[tuple[torch.Tensor, int]]:
        """The image processor's output -> per image (pixels, placeholder tokens)."""
        pixels = processed["pixel_values"].to(torch.float32)
        if tuple(pixels.shape[-2:]) != (self.image_size, self.image_size):
            raise ValueError(f"the image processor makes {tuple(pixels.shape[-2:])} images, the vision tower takes "
                             f"{self.image_size}x{self.image_size}")
        return [(image, self.tokens_per_image) for image in pixels]

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[images, channels, H, W] -> [images, tokens_per_image, text hidden size]."""
        states = self.vision_tower.hidden_states(pixel_values, max(self.feature_layers))
        features = torch.cat([states[layer] for layer in self.feature_layers], dim=-1)
        if not self.keep_class_token:
            features = features[:, 1:]
        return self.multi_modal_projector(features)

    own_name = staticmethod(tower_and_projector_name)
