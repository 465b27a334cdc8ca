"""SigLIP's vision transformer (Gemma 3's and LLaVA-OneVision's tower): CLIP's encoder (engine/models/vision/
clip_vision.py) without a class token or a norm before the first layer: a biased patch convolution plus a learned
position per patch, the layers, a final LayerNorm (which the LLaVA family's hidden-layer features skip)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from engine.models.vision.clip_vision import clip_encoder, embed_patches


class SiglipVisionEmbeddings(nn.Module):
    def __init__(self, hidden_size: int, image_size: int, patch_size: int, num_channels: int) -> None:
        super().__init__()
        self.image_size = image_size
        self.patch_embedding = nn.Conv2d(num_channels, hidden_size, kernel_size=patch_size, stride=patch_size)
        self.patches_per_side = image_size // patch_size
        self.num_patches = self.patches_per_side ** 2
        self.position_embedding = nn.Embedding(self.num_patches, hidden_size)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[images, channels, H, W] -> [images, patches, hidden]."""
        return embed_patches(self.patch_embedding, pixel_values, self.image_size) + self.position_embedding.weight


# Gemma 3's SigLIP (so400m at 896 pixels), for keys a vision_config leaves out.
SIGLIP_DEFAULTS = {"hidden_size": 1152, "num_attention_heads": 16, "layer_norm_eps": 1e-6,
                   "hidden_act": "gelu_pytorch_tanh", "intermediate_size": 4304, "num_hidden_layers": 27}


class SiglipVisionTransformer(nn.Module):
    def __init__(self, vision_config: dict[str, Any]) -> None:
        super().__init__()
        get = vision_config.get
        hidden_size, eps, self.encoder = clip_encoder(vision_config, SIGLIP_DEFAULTS)
        self.embeddings = SiglipVisionEmbeddings(hidden_size, int(get("image_size", 896)), int(get("patch_size", 14)),
                                                 int(get("num_channels", 3)))
        self.post_layernorm = nn.LayerNorm(hidden_size, eps=eps)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        hidden_states = self.embeddings(pixel_values)
        for layer in self.encoder.layers:
            hidden_states = layer(hidden_states)
        return self.post_layernorm(hidden_states)

    # CLIP's interface to the LLaVA family (engine/models/vision/llava.py).
    has_class_token = False

    @property
    def num_layers(self) -> int:
        return len(self.encoder.layers)

    def hidden_states(self, pixel_values: torch.Tensor, deepest: int) -> list[torch.Tensor]:
        """The embeddings' output (index 0) and each layer's up to layer ``deepest`` (1-based), before the final
        norm, as transformers' ``hidden_states`` tuple indexes them."""
        states = [self.embeddings(pixel_values)]
        for layer in self.encoder.layers[:deepest]:
            states.append(layer(states[-1]))
        return states
