"""CLIP's vision transformer (LLaVA's vision tower), as checkpoints store it.

An image of ``image_size`` x ``image_size`` pixels is cut into patches of ``patch_size`` (a strided convolution), a
learned class token goes in front, a learned position embedding is added to each of the 1 + patches tokens, and a
pre-norm transformer (full attention among one image's tokens, quick-GELU MLP) runs over them. LLaVA reads the hidden
states after one of its layers (``vision_feature_layer``; -2: all but the last), so ``forward`` returns every layer's
output and never runs a layer past the deepest one asked for.

Parameter names follow the checkpoint's (``embeddings.patch_embedding``, ``pre_layrnorm`` with its spelling,
``encoder.layers.N.self_attn.q_proj``...), so weights load by name.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(1.702 * x)


VISION_ACTIVATIONS = {
    "quick_gelu": quick_gelu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,  # Qwen2.5-VL's gated MLPs
}


def vision_activation(name: str, field: str):
    if name not in VISION_ACTIVATIONS:
        raise ValueError(f"config.json: {field} {name!r} is not supported; supported: {', '.join(VISION_ACTIVATIONS)}")
    return VISION_ACTIVATIONS[name]


def embed_patches(convolution: nn.Conv2d, pixel_values: torch.Tensor, image_size: int) -> torch.Tensor:
    """[images, channels, H, W] of the tower's size -> [images, patches, hidden] (CLIP's and SigLIP's patches)."""
    height, width = pixel_values.shape[-2:]
    if (height, width) != (image_size, image_size):
        raise ValueError(f"the vision tower takes {image_size}x{image_size} images, got {height}x{width}")
    return convolution(pixel_values.to(convolution.weight.dtype)).flatten(2).transpose(1, 2)


class ClipVisionEmbeddings(nn.Module):
    def __init__(self, hidden_size: int, image_size: int, patch_size: int, num_channels: int) -> None:
        super().__init__()
        self.image_size = image_size
        self.class_embedding = nn.Parameter(torch.empty(hidden_size))
        self.patch_embedding = nn.Conv2d(num_channels, hidden_size, kernel_size=patch_size, stride=patch_size,
                                         bias=False)
        self.num_patches = (image_size // patch_size) ** 2
        self.position_embedding = nn.Embedding(self.num_patches + 1, hidden_size)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[images, channels, H, W] -> [images, 1 + patches, hidden]."""
        patches = embed_patches(self.patch_embedding, pixel_values, self.image_size)
        class_token = self.class_embedding.expand(patches.shape[0], 1, -1)
        return torch.cat([class_token, patches], dim=1) + self.position_embedding.weight


class ClipAttention(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.q_proj = nn.Linear(hidden_size, hidden_size)
        self.k_proj = nn.Linear(hidden_size, hidden_size)
        self.v_proj = nn.Linear(hidden_size, hidden_size)
        self.out_proj = nn.Linear(hidden_size, hidden_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        images, tokens, hidden = hidden_states.shape

        def heads(x: torch.Tensor) -> torch.Tensor:
            return x.view(images, tokens, self.num_heads, hidden // self.num_heads).transpose(1, 2)

        # Every token of an image sees every other (no mask): the encoder is not causal.
        attended = F.scaled_dot_product_attention(heads(self.q_proj(hidden_states)), heads(self.k_proj(hidden_states)),
                                                  heads(self.v_proj(hidden_states)))
        return self.out_proj(attended.transpose(1, 2).reshape(images, tokens, hidden))


class ClipMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, activation) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden_size, intermediate_size)
        self.fc2 = nn.Linear(intermediate_size, hidden_size)
        self.activation = activation

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation(self.fc1(hidden_states)))


class ClipEncoderLayer(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, num_heads: int, eps: float, activation) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(hidden_size, eps=eps)
        self.self_attn = ClipAttention(hidden_size, num_heads)
        self.layer_norm2 = nn.LayerNorm(hidden_size, eps=eps)
        self.mlp = ClipMLP(hidden_size, intermediate_size, activation)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = hidden_states + self.self_attn(self.layer_norm1(hidden_states))
        return hidden_states + self.mlp(self.layer_norm2(hidden_states))


class ClipEncoder(nn.Module):
    def __init__(self, layers: list[ClipEncoderLayer]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)


def clip_encoder(vision_config: dict[str, Any], defaults: dict[str, Any]) -> tuple[int, float, ClipEncoder]:
    """(hidden size, LayerNorm eps, the encoder's layers) of a CLIP-style tower (CLIP, SigLIP), keys the config
    leaves out taken from ``defaults`` (its config class's)."""
    def get(key: str):
        return vision_config.get(key, defaults[key])

    hidden_size, num_heads = int(get("hidden_size")), int(get("num_attention_heads"))
    if hidden_size % num_heads:
        raise ValueError(f"config.json: vision_config.hidden_size {hidden_size} is not a multiple of "
                         f"vision_config.num_attention_heads {num_heads}")
    eps = float(get("layer_norm_eps"))
    activation = vision_activation(get("hidden_act"), "vision_config.hidden_act")
    return hidden_size, eps, ClipEncoder([ClipEncoderLayer(hidden_size, int(get("intermediate_size")), num_heads, eps,
                                                           activation)
                                          for _ in range(int(get("num_hidden_layers")))])


# transformers' CLIPVisionConfig defaults.
CLIP_DEFAULTS = {"hidden_size": 1024, "num_attention_heads": 16, "layer_norm_eps": 1e-5, "hidden_act": "quick_gelu",
                 "intermediate_size": 4096, "num_hidden_layers": 24}


class ClipVisionTransformer(nn.Module):
    has_class_token = True

    def __init__(self, vision_config: dict[str, Any]) -> None:
        super().__init__()
        get = vision_config.get
        hidden_size, eps, self.encoder = clip_encoder(vision_config, CLIP_DEFAULTS)
        self.embeddings = ClipVisionEmbeddings(hidden_size, int(get("image_size", 224)), int(get("patch_size", 32)),
                                               int(get("num_channels", 3)))
        self.pre_layrnorm = nn.LayerNorm(hidden_size, eps=eps)
        # Kept so a checkpoint's weights load by name; LLaVA reads a hidden layer's output, never this norm's.
        self.post_layernorm = nn.LayerNorm(hidden_size, eps=eps)

    @property
    def num_layers(self) -> int:
        return len(self.encoder.layers)

    def hidden_states(self, pixel_values: torch.Tensor, deepest: int) -> list[torch.Tensor]:
        """The embeddings' output (index 0, after the pre-norm) and each layer's up to layer ``deepest`` (1-based),
        as transformers' ``hidden_states`` tuple indexes them."""
        states = [self.pre_layrnorm(self.embeddings(pixel_values))]
        for layer in self.encoder.layers[:deepest]:
            states.append(layer(states[-1]))
        return states
