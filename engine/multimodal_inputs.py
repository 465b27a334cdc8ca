"""Images in a prompt: vLLM's ``multi_modal_data`` turned into placeholder tokens and the core's multimodal items.

A prompt marks each image with the checkpoint's image token (LLaVA's ``<image>``, Qwen2-VL's ``<|image_pad|>``). The
images are preprocessed by the checkpoint's own image processor (``preprocessor_config.json``, read by transformers,
as vLLM does); each mark becomes as many placeholder tokens as its image's encoder output has embeddings (LLaVA: a
fixed count; Qwen2-VL: the image's resolution decides), a run already that long being taken as it is (as a prompt
rendered by transformers' processor has it); and each image becomes a ``MultiModalFeature``: where its placeholders
start, how many there are, a content hash of its encoder input, and that input for the runner's encoder.
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
from engine.models.vision.image_encoders import fixed_image_size


class ImageInputs:
    def __init__(self, checkpoint: str | Path, encoder) -> None:
        """``encoder``: the runner's image encoder (engine/models/vision/), which splits the processor's output."""
        self.checkpoint = Path(checkpoint)
        self.encoder = encoder
        self.image_token_id = encoder.image_token_id
        # What a prompt marks each image with (the image token, or Gemma 3's <start_of_image>).
        self.mark_token_id = encoder.mark_token_id if encoder.mark_token_id is not None else encoder.image_token_id
        fixed = fixed_image_size(encoder)
        # Pixels a side and placeholder tokens of every image, for an encoder of one image size (None otherwise).
        self.image_size, self.tokens_per_image = fixed if fixed is not None else (None, None)
        self._processor = None

    @property
    def max_tokens_per_image(self) -> int:
        """The most placeholder tokens one image can take: the fixed count, or (an image at its own resolution) what
        the processor's largest image gives (the encoder reads the processor's bound)."""
        if self.tokens_per_image is not None:
            return self.tokens_per_image
        try:
            return self.encoder.max_tokens(self.processor)
        except ValueError as error:
            raise ValueError(f"model {str(self.checkpoint)!r}: {error}") from None

    def picture_size(self, tokens: int) -> tuple[int, int] | None:
        """(height, width) in pixels of a picture of ``tokens`` placeholder tokens, for an encoder at each image's own
        resolution (None: no such picture)."""
        return self.encoder.picture_size(tokens, self.processor)

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

    def encoder_inputs(self, label: str, images: list[Any], one_prompt: bool = False) -> list[tuple[Any, int]]:
        """Per image (the encoder's input, its placeholder tokens), as the checkpoint's processor makes them;
        ``one_prompt``: the images of one prompt, which some families process as a group (each alone otherwise)."""
        for index, image in enumerate(images):
            if not (_is_pil_image(image) or (isinstance(image, np.ndarray) and image.ndim == 3)):
                raise ValueError(f"{label}: multi_modal_data['image'][{index}] must be a PIL image or an H x W x C "
                                 f"numpy array, got {type(image).__name__}")
        try:
            grouped = [images] if one_prompt and self.encoder.groups_prompt_images else images
            return self.encoder.split_processed(self.processor(images=grouped, return_tensors="pt"))
        except ValueError as error:
            raise ValueError(f"{label}: model {str(self.checkpoint)!r}: {error}") from None

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
        marks = _runs(token_ids, self.mark_token_id)
        if len(marks) != len(images):
            raise ValueError(f"{label}: multi_modal_data['image'] has {len(images)} image(s) but the prompt marks "
                             f"{len(marks)} (image token id {self.mark_token_id}); put one mark where each image goes")
        if not images:
            return token_ids, ()
        inputs = self.encoder_inputs(label, images, one_prompt=True)
        expanded: list[int] = []
        features = []
        previous_end = 0
        for index, ((start, length), (data, tokens)) in enumerate(zip(marks, inputs)):
            # Most encoders' spans are the image token repeated; Mistral 3's a grid with row breaks; Gemma 3's
            # placeholders sit between a blank line and its mark, and its end mark and a blank line.
            try:
                before, placeholders, after = self.encoder.placeholder_span(data, tokens)
            except ValueError as error:
                raise ValueError(f"{label}: model {str(self.checkpoint)!r}: {error}") from None
            span = before + placeholders + after
            at = span.index(self.mark_token_id)
            # An expanded image is recognized from its mark through the placeholders and the mark after them, if
            # any (Gemma 3's <end_of_image>): the text around it is the prompt's own.
            from_mark = span[at:len(before) + len(placeholders) + min(1, len(after))]
            expanded.extend(token_ids[previous_end:start])
            if token_ids[start:start + len(from_mark)] == from_mark and length == _run_length(from_mark):
                # Already expanded (as transformers' processor writes the prompt): taken as it is.
                features.append(MultiModalFeature(identifier(data), len(expanded) + len(before) - at, tokens,
                                                  data=data))
                expanded.extend(from_mark)
                previous_end = start + len(from_mark)
            elif length == 1:
                features.append(MultiModalFeature(identifier(data), len(expanded) + len(before), tokens, data=data))
                expanded.extend(span)
                previous_end = start + 1
            else:
                raise ValueError(f"{label}: image {index}'s mark is a run of {length} image tokens; it must be 1 "
                                 f"(expanded here) or {tokens} (its placeholder tokens)")
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


def _run_length(tokens: list[int]) -> int:
    """How many times ``tokens`` repeats its first token at its start."""
    count = 0
    while count < len(tokens) and tokens[count] == tokens[0]:
        count += 1
    return count


def identifier(data) -> str:
    """A content hash of an encoder input (a tensor, or a tuple of tensors and sizes): equal inputs, equal encoder
    output (vLLM's ``mm_hash``)."""
    digest = hashlib.sha256()
    for part in data if isinstance(data, tuple) else (data,):
        if isinstance(part, torch.Tensor):
            array = part.contiguous().numpy()
            digest.update(str(array.shape).encode() + array.tobytes())
        else:
            digest.update(repr(part).encode())
    return digest.hexdigest()


def _is_pil_image(value: Any) -> bool:
    try:
        from PIL import Image
    except ImportError:
        return False
    return isinstance(value, Image.Image)
