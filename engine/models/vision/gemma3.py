"""Gemma 3's image path (4B-27B): a SigLIP vision tower, average pooling to ``mm_tokens_per_image`` tokens and a
projection into the language model's embedding space (transformers' ``Gemma3ForConditionalGeneration`` without its
language model).

SigLIP is engine/models/vision/siglip_vision.py's (its final LayerNorm applied). The projector
pools the square grid of patches (896 pixels / 14 = 64 a side) down to 16 x 16, normalizes each pooled vector by
Gemma's RMSNorm (times 1 + weight) and multiplies it by ``mm_input_projection_weight``: 256 embeddings an image,
which take the language model's embeddings' place unscaled (the text's are scaled by sqrt(hidden)).

In a prompt an image is ``<start_of_image>`` (the mark), which becomes the processor's span: a blank line, the mark,
``mm_tokens_per_image`` image tokens, ``<end_of_image>``, a blank line; the item is the image tokens alone. The
language model attends among one image's tokens both ways (every image token sees the whole image, within its
layer's window), text causally: ``bidirectional_image_attention``, which the runner turns into attention spans and
the engine into keeping each image in one prefill chunk.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.gemma import GemmaRMSNorm
from engine.models.vision.encoder_base import ImageEncoder, tower_and_projector_name
from engine.models.vision.siglip_vision import SiglipVisionTransformer


class Gemma3Projector(nn.Module):
    def __init__(self, vision_hidden: int, text_hidden: int, eps: float, patches_per_side: int,
                 tokens_per_image: int) -> None:
        super().__init__()
        tokens_per_side = int(round(tokens_per_image ** 0.5))
        if tokens_per_side ** 2 != tokens_per_image or patches_per_side % tokens_per_side:
            raise ValueError(f"config.json: mm_tokens_per_image {tokens_per_image} must be a square whose side divides "
                             f"the tower's {patches_per_side} patches a side")
        self.patches_per_side = patches_per_side
        self.kernel = patches_per_side // tokens_per_side
        self.mm_input_projection_weight = nn.Parameter(torch.empty(vision_hidden, text_hidden))
        self.mm_soft_emb_norm = GemmaRMSNorm(vision_hidden, eps)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """[images, patches, vision hidden] -> [images, tokens_per_image, text hidden]."""
        images, _, hidden = patches.shape
        grid = patches.transpose(1, 2).reshape(images, hidden, self.patches_per_side, self.patches_per_side)
        pooled = F.avg_pool2d(grid, self.kernel, self.kernel).flatten(2).transpose(1, 2)
        return torch.matmul(self.mm_soft_emb_norm(pooled), self.mm_input_projection_weight).type_as(patches)


class Gemma3ImageEncoder(ImageEncoder):
    family = "Gemma 3"
    bidirectional_image_attention = True

    def __init__(self, raw: dict[str, Any]) -> None:
        super().__init__()
        vision_config = raw.get("vision_config") or {}
        tower_type = vision_config.get("model_type", "siglip_vision_model")
        if tower_type != "siglip_vision_model":
            raise ValueError(f"config.json: vision_config.model_type {tower_type!r} is not supported for Gemma 3 "
                             "images (a SigLIP tower, 'siglip_vision_model', is)")
        self.vision_tower = SiglipVisionTransformer(vision_config)
        tokens = raw.get("mm_tokens_per_image", 256)
        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
            raise ValueError(f"config.json: mm_tokens_per_image must be a positive integer, got {tokens!r}")
        self.tokens_per_image = tokens
        self.multi_modal_projector = Gemma3Projector(
            int(vision_config.get("hidden_size", 1152)), int((raw.get("text_config") or {}).get("hidden_size", 2304)),
            float(vision_config.get("layer_norm_eps", 1e-6)), self.vision_tower.embeddings.patches_per_side, tokens)
        ids = {}
        for name, default in (("image_token", 262_144), ("boi_token", 255_999), ("eoi_token", 256_000)):
            value = raw.get(f"{name}_index", raw.get(f"{name}_id", default))
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"config.json: {name}_index must be a token id, got {value!r}")
            ids[name] = value
        self.image_token_id, self.mark_token_id, self.end_token_id = ids["image_token"], ids["boi_token"], \
            ids["eoi_token"]
        # "\n\n" around each image, as the processor writes it; its id is the tokenizer's (attach_language_model).
        self.blank_line_id: int | None = None

    @property
    def image_size(self) -> int:
        return self.vision_tower.embeddings.image_size

    def attach_language_model(self, model, tokenizer, checkpoint) -> None:
        if tokenizer is None:
            return
        ids = tokenizer.encode("\n\n", add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"model {str(checkpoint)!r}: its tokenizer writes '\\n\\n' as {len(ids)} tokens; Gemma 3's "
                             "image span needs it as one")
        self.blank_line_id = ids[0]

    def placeholder_span(self, data, tokens: int) -> tuple[list[int], list[int], list[int]]:
        if self.blank_line_id is None:
            raise ValueError("Gemma 3 images need the checkpoint's tokenizer, whose '\\n\\n' surrounds each image; "
                             "create the engine without skip_tokenizer_init")
        return ([self.blank_line_id, self.mark_token_id], [self.image_token_id] * tokens,
                [self.end_token_id, self.blank_line_id])

    def encode(self, items: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each item's pixels [channels, H, W] -> its embeddings [tokens_per_image, text hidden]; one batch."""
        weight = self.multi_modal_projector.mm_input_projection_weight
        pixels = torch.stack(items).to(weight.device, weight.dtype)
        return list(self.multi_modal_projector(self.vision_tower(pixels)))

    def split_processed(self, processed) -> list[tuple[torch.Tensor, int]]:
        """The image processor's output -> per image (pixels, placeholder tokens). Pan-and-scan crops (off by
        default) would make an image several; they are refused by name."""
        pixels = processed["pixel_values"].to(torch.float32)
        crops = processed.get("num_crops")
        if crops is not None and any(int(count) for count in torch.as_tensor(crops).flatten().tolist()):
            raise ValueError("the image processor cut pan-and-scan crops (do_pan_and_scan); Gemma 3 images are taken "
                             "whole only")
        if tuple(pixels.shape[-2:]) != (self.image_size, self.image_size):
            raise ValueError(f"the image processor makes {tuple(pixels.shape[-2:])} images, the vision tower takes "
                             f"{self.image_size}x{self.image_size}")
        return [(image, self.tokens_per_image) for image in pixels]

    own_name = staticmethod(tower_and_projector_name)
