"""Which vision-language checkpoints the engine takes images for, and loading their image encoders.

A checkpoint whose architecture has no encoder here still serves text as its language model
(engine/models/multimodal_text.py); a request with images to it is refused by name (engine/multimodal_inputs.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from engine.models.vision.encoder_base import ImageEncoder
from engine.models.vision.gemma3 import Gemma3ImageEncoder
from engine.models.vision.internvl import InternVLImageEncoder
from engine.models.vision.llava import LlavaImageEncoder
from engine.models.vision.llava_next import LlavaNextImageEncoder
from engine.models.vision.llava_onevision import LlavaOnevisionImageEncoder
from engine.models.vision.pixtral import Mistral3ImageEncoder
from engine.models.vision.qwen2_5_vl import Qwen25VLImageEncoder
from engine.models.vision.qwen2_vl import Qwen2VLImageEncoder
from engine.models.vision.qwen3_vl import Qwen3VLImageEncoder


IMAGE_ENCODERS = {"LlavaForConditionalGeneration": LlavaImageEncoder,
                  "LlavaNextForConditionalGeneration": LlavaNextImageEncoder,
                  "LlavaOnevisionForConditionalGeneration": LlavaOnevisionImageEncoder,
                  "Gemma3ForConditionalGeneration": Gemma3ImageEncoder,
                  "InternVLForConditionalGeneration": InternVLImageEncoder,
                  "Qwen2VLForConditionalGeneration": Qwen2VLImageEncoder,
                  "Qwen2_5_VLForConditionalGeneration": Qwen25VLImageEncoder,
                  "Qwen3VLForConditionalGeneration": Qwen3VLImageEncoder,
                  "Qwen3VLMoeForConditionalGeneration": Qwen3VLImageEncoder,
                  "Mistral3ForConditionalGeneration": Mistral3ImageEncoder}


def fixed_image_size(encoder) -> tuple[int, int] | None:
    """(pixels a side, placeholder tokens) of an encoder whose images all have one size (LLaVA); None for one at
    each image's own resolution (Qwen2-VL)."""
    return None if encoder.image_size is None else (encoder.image_size, encoder.tokens_per_image)


def image_encoder_class(architectures: list[str]) -> type | None:
    return next((IMAGE_ENCODERS[name] for name in architectures if name in IMAGE_ENCODERS), None)


def load_image_encoder(path: str | Path, dtype: torch.dtype, device: torch.device) -> ImageEncoder | None:
    """The checkpoint's image encoder in eval mode, or None when the engine takes no images for it."""
    from engine.models.loader import iterate_weights, safetensors_files

    raw = json.loads((Path(path) / "config.json").read_text())
    encoder_class = image_encoder_class(raw.get("architectures") or [])
    if encoder_class is None:
        return None
    with torch.device("meta"):
        encoder = encoder_class(raw)
    encoder = encoder.to(dtype=dtype).to_empty(device=device)
    loaded = encoder.load_weights(iterate_weights(safetensors_files(path)))
    missing = sorted(set(dict(encoder.named_parameters())) - loaded)
    if missing:
        raise ValueError(f"checkpoint {str(path)!r} is missing {len(missing)} image-encoder weight(s), "
                         f"e.g. {missing[:5]}")
    return encoder.eval().requires_grad_(False)
