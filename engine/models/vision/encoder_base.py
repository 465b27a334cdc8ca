"""What every image encoder is to the engine (engine/multimodal_inputs.py, engine/runner/encoder_outputs.py), with the
defaults most families keep: an image's span in the prompt is the image token repeated, nothing to learn from the
language model, and tensors loaded by name from the checkpoint (the language model's skipped)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn


def tower_and_projector_name(name: str) -> str | None:
    """A checkpoint tensor's name in an encoder made of ``vision_tower`` and ``multi_modal_projector`` (LLaVA's
    family, Gemma 3), or None for the language model's and a SigLIP tower's pooling head, which none of them reads.
    Published checkpoints write ``vision_tower.vision_model.``, transformers 5 ``vision_tower.`` (or
    ``model.vision_tower.``)."""
    name = name.removeprefix("model.")
    if name.startswith("vision_tower."):
        inner = name.removeprefix("vision_tower.").removeprefix("vision_model.")
        return None if inner.startswith("head.") else "vision_tower." + inner
    return name if name.startswith("multi_modal_projector.") else None


class ImageEncoder(nn.Module):
    # Named in errors ("the LLaVA image encoder").
    family = "vision-language"
    # The token id a prompt marks an image with.
    image_token_id: int
    # Pixels a side of every image, for an encoder of one image size (LLaVA: its ``tokens_per_image`` then too);
    # None for one that encodes each image at its own resolution.
    image_size: int | None = None
    # The token a prompt marks an image with, when not the image token itself (Gemma 3's <start_of_image>).
    mark_token_id: int | None = None
    # Whether the language model attends among one image's placeholders both ways (Gemma 3): the runner gives the
    # attention each image's span, and the engine keeps every image in one prefill chunk.
    bidirectional_image_attention = False
    # Whether a prompt's images are processed as one group (LLaVA-OneVision treats an image shown with others
    # differently from one shown alone); otherwise each image alone.
    groups_prompt_images = False

    def split_processed(self, processed) -> list[tuple[Any, int]]:
        """The checkpoint's image processor's output -> per image (the encoder's input for it, its placeholder
        tokens: how many embeddings it becomes)."""
        raise NotImplementedError

    def encode(self, items: list) -> list[torch.Tensor]:
        """Each item's input -> its embeddings [placeholder tokens, the language model's hidden size]."""
        raise NotImplementedError

    def placeholder_ids(self, data, tokens: int) -> list[int]:
        """The image's span in the prompt (``tokens`` long)."""
        return [self.image_token_id] * tokens

    def placeholder_span(self, data, tokens: int) -> tuple[list[int], list[int], list[int]]:
        """(the tokens a mark's expansion puts before the placeholders, the placeholders, those after); the item is
        the placeholders. Most families put nothing around them; the mark is one of the ``before`` tokens, or the
        placeholders' first."""
        return [], self.placeholder_ids(data, tokens), []

    def attach_language_model(self, model, tokenizer, checkpoint) -> None:
        """Called once the language model (and the tokenizer, or None) is loaded; for a span that holds the
        language model's own embeddings of some tokens (Mistral 3's row marks)."""

    @staticmethod
    def own_name(name: str) -> str | None:
        """A checkpoint tensor's name in this module, or None for a tensor that is not the encoder's."""
        raise NotImplementedError

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy each tensor ``own_name`` maps to one of the parameters; a tensor that names no parameter of that shape
        is a ValueError naming it. Returns the parameters filled."""
        params = dict(self.named_parameters())
        loaded = set()
        for checkpoint_name, tensor in weights:
            name = self.own_name(checkpoint_name)
            if name is None:
                continue
            if name not in params or params[name].shape != tensor.shape:
                expected = tuple(params[name].shape) if name in params else "no such parameter"
                raise ValueError(f"checkpoint tensor {checkpoint_name!r} {tuple(tensor.shape)} has no place in the "
                                 f"{self.family} image encoder ({name}: {expected})")
            params[name].data.copy_(tensor)
            loaded.add(name)
        return loaded
