"""Images in a prompt: vLLM's ``multi_modal_data`` turned into placeholder tokens and the core's multimodal items.

A prompt marks each image with the checkpoint's image token (LLaVA's ``<image>``). Each mark becomes
``tokens_per_image`` placeholder tokens (a run already that long is taken as it is, as a prompt rendered by
transformers' processor has it), the images are preprocessed by the checkpoint's own image processor
(``preprocessor_config.json``, read by transformers, as vLLM does), and each becomes a ``MultiModalFeature``: where
its placeholders start, how many there are, a content hash of its pixels, and the pixels for the runner's encoder.
Equal pixels give equal identifiers, so the core encodes a repeated image once while its output is kept and shares
the KV of the same image after the same prefix (engine/core/multimodal.py).

Checked here, before anything reaches the scheduler: the data's keys, the images' types, and that marks and images
agree in number; every error names the prompt and the field.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.core.multimodal import MultiModalFeature


class ImageInputs:
    def __init__(self, checkpoint: str | Path, image_token_id: int, tokens_per_image: int, image_size: int) -> None:
        self.checkpoint = Path(checkpoint)
        self.image_token_id = image_token_id
        self.tokens_per_image = tokens_per_image
        self.image_size = image_size
        self._processor = None

    @classmethod
    def for_encoder(cls, checkpoint: str | Path, encoder) -> "ImageInputs":
        return cls(checkpoint, encoder.image_token_id, encoder.tokens_per_image, encoder.image_size)

    @property
    def processor(self):
        """The checkpoint's image processor (transformers', with Pillow), loaded at the first image."""
        if self._processor is None:
            if not (self.checkpoint / "preprocessor_config.json").is_file():
                raise ValueError(f"model {str(self.checkpoint)!r} has no preprocessor_config.json: the engine cannot "
                                 "tell how to resize and normalize its images")
            try:
                from transformers import AutoImageProcessor
            except ImportError as error:  # pragma: no cover - the real extra installs both
                raise ValueError(f"images need transformers and Pillow (pip install -e '.[real]'): {error}") from None
            self._processor = AutoImageProcessor.from_pretrained(str(self.checkpoint))
        return self._processor

    def pixel_values(self, label: str, images: list[Any]) -> torch.Tensor:
        """[images, channels, size, size] float32, as the checkpoint's processor makes them."""
        for index, image in enumerate(images):
            if not (_is_pil_image(image) or (isinstance(image, np.ndarray) and image.ndim == 3)):
                raise ValueError(f"{label}: multi_modal_data['image'][{index}] must be a PIL image or an H x W x C "
                                 f"numpy array, got {type(image).__name__}")
        pixels = self.processor(images=images, return_tensors="pt")["pixel_values"].to(torch.float32)
        if tuple(pixels.shape[-2:]) != (self.image_size, self.image_size):
            raise ValueError(f"model {str(self.checkpoint)!r}: its image processor makes {tuple(pixels.shape[-2:])} "
                             f"images, its vision tower takes {self.image_size}x{self.image_size}")
        return pixels

    def process(self, label: str, token_ids: list[int], multi_modal_data: Any) -> tuple[list[int], tuple]:
        """(the prompt's tokens with each image mark expanded to its placeholders, the images' features)."""
        if not isinstance(multi_modal_data, dict):
            raise ValueError(f"{label}: multi_modal_data must be a dict such as {{'image': image}}, got "
                             f"{type(multi_modal_data).__name__}")
        unknown = sorted(set(multi_modal_data) - {"image"})
        if unknown:
            raise ValueError(f"{label}: multi_modal_data has {unknown}; this engine takes images only ('image')")
        images = multi_modal_data.get("image")
        images = list(images) if isinstance(images, (list, tuple)) else [images] if images is not None else []
        marks = _runs(token_ids, self.image_token_id)
        if len(marks) != len(images):
            raise ValueError(f"{label}: multi_modal_data['image'] has {len(images)} image(s) but the prompt marks "
                             f"{len(marks)} (image token id {self.image_token_id}); put one mark where each image goes")
        if not images:
            return token_ids, ()
        bad = [length for _, length in marks if length not in (1, self.tokens_per_image)]
        if bad:
            raise ValueError(f"{label}: an image mark is a run of {bad[0]} image tokens; it must be 1 (expanded here) "
                             f"or {self.tokens_per_image} (this model's tokens per image)")
        pixels = self.pixel_values(label, images)
        expanded: list[int] = []
        features = []
        previous_end = 0
        for (start, length), image_pixels in zip(marks, pixels):
            expanded.extend(token_ids[previous_end:start])
            features.append(MultiModalFeature(_identifier(image_pixels), len(expanded), self.tokens_per_image,
                                              data=image_pixels))
            expanded.extend([self.image_token_id] * self.tokens_per_image)
            previous_end = start + length
        expanded.extend(token_ids[previous_end:])
        return expanded, tuple(features)


def _runs(token_ids: list[int], token: int) -> list[tuple[int, int]]:
    """(start, length) of each maximal run of ``token`` in ``token_ids``."""
    runs: list[tuple[int, int]] = []
    for position, token_id in enumerate(token_ids):
        if token_id != token:
            continue
        if runs and runs[-1][0] + runs[-1][1] == position:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((position, 1))
    return runs


def _identifier(pixels: torch.Tensor) -> str:
    """A content hash of the encoder's input: equal pixels, equal encoder output (vLLM's ``mm_hash``)."""
    array = pixels.contiguous().numpy()
    return hashlib.sha256(str(array.shape).encode() + array.tobytes()).hexdigest()


def _is_pil_image(value: Any) -> bool:
    try:
        from PIL import Image
    except ImportError:
        return False
    return isinstance(value, Image.Image)
