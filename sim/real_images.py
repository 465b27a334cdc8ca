"""Images in real runs: a picture for each image a workload shows, for a checkpoint whose images the engine encodes.

A workload names its images by identifier (workloads/images.py): a pool image comes back under the same name. A real
run needs pixels: each identifier gets a picture drawn from a generator seeded by its name (the same picture in
every run and for every request that shows it), preprocessed by the checkpoint's own image processor before the
clock starts, so no request waits on preprocessing inside the measured run. The core's features carry the
workload's identifiers, so the real engine shares encoder outputs and cached KV exactly where the simulator does,
and a replay rebuilds the same requests without any pixels.

Each image is the model's fixed number of placeholder tokens (LLaVA: its patches; a workload asking for another count
is refused by name), or, for a model that encodes each image at its own resolution (Qwen2-VL, 2.5-VL, 3-VL), the
workload's ``tokens_per_image`` for it: its picture is drawn at a size the processor keeps (rows x columns of merged
blocks, as near square as the count allows), and an image the processor would resize to another count is refused by
name. The placeholders are the workload's placeholder token (the vocabulary's last id), not the
checkpoint's image token: the runner fills placeholder rows by position, whatever their id.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sim.vision_setup import VisionSetupError
from workloads import RequestSpec, WorkloadConfig
from workloads.distributions import ConstantLength

if TYPE_CHECKING:  # the engine (and torch) only where a real run is made
    from engine.multimodal_inputs import ImageInputs


@dataclass(frozen=True)
class RealImages:
    inputs: ImageInputs

    @property
    def tokens_per_image(self) -> int | None:
        """Every image's placeholder tokens (None: each image's own, as the workload draws them)."""
        return self.inputs.tokens_per_image

    def check(self, workload: WorkloadConfig) -> None:
        for where, section in workload.image_sections():
            tokens = section.tokens_per_image
            if self.tokens_per_image is None:
                most = self.inputs.max_tokens_per_image
                if tokens is None or tokens.upper_bound() > most:
                    raise VisionSetupError(f"{where}.tokens_per_image: the real model's images take as many tokens as "
                                           f"their resolution gives, at most {most}; draw each image's count within "
                                           f"that, got {tokens!r}")
                continue
            if tokens is None:
                continue
            if not isinstance(tokens, ConstantLength) or tokens.value != self.tokens_per_image:
                raise VisionSetupError(f"{where}.tokens_per_image: the real model's images are "
                                       f"{self.tokens_per_image} tokens each; set it to that or null, got {tokens!r}")

    def pixels(self, requests: list[RequestSpec]) -> dict:
        """Each image identifier of ``requests`` -> the encoder's input for its picture, in first-shown order."""
        tokens_of = {}
        for spec in requests:
            for identifier, _, tokens in spec.images:
                tokens_of.setdefault(identifier, tokens)
        identifiers = list(tokens_of)
        pictures = [picture(identifier, *self.picture_shape(tokens_of[identifier])) for identifier in identifiers]
        batch = 64  # the processor's working memory stays small whatever the workload's number of images
        inputs = []
        for start in range(0, len(pictures), batch):
            chunk = pictures[start:start + batch]
            inputs.extend(self.inputs.encoder_inputs("workload images", chunk))
        for identifier, (_, made) in zip(identifiers, inputs):
            if made != tokens_of[identifier]:
                raise VisionSetupError(f"workload.images.tokens_per_image: image {identifier!r} of "
                                       f"{tokens_of[identifier]} tokens came out of the model's image processor as "
                                       f"{made} (its smallest and largest images bound the count)")
        return {identifier: data for identifier, (data, _) in zip(identifiers, inputs)}

    def picture_shape(self, tokens: int) -> tuple[int, int]:
        """(height, width) in pixels of a picture of ``tokens`` placeholder tokens."""
        if self.inputs.image_size is not None:
            return self.inputs.image_size, self.inputs.image_size
        size = self.inputs.picture_size(tokens)
        if size is None:
            raise VisionSetupError(f"workload.images.tokens_per_image: the real model makes no image of {tokens} "
                                   "tokens")
        return size


def picture(identifier: str, height: int, width: int | None = None) -> np.ndarray:
    """A ``height`` x ``width`` (square if None) RGB picture drawn from a generator seeded by ``identifier``'s hash."""
    seed = int.from_bytes(hashlib.sha256(identifier.encode("utf-8")).digest()[:8], "little")
    return np.random.default_rng(seed).integers(0, 256, (height, width or height, 3), dtype=np.uint8)


def check_real_run_images(workload: WorkloadConfig, images: RealImages | None, executor: str = "real") -> None:
    """A workload with images needs a real engine that encodes them (``images``; None: a text model)."""
    sections = workload.image_sections()
    if not sections:
        return
    where = sections[0][0]
    if executor == "server":
        raise VisionSetupError(f"{where}: images are not sent to a server (--executor server sends text prompts); "
                               "record them with --executor real and a LLaVA checkpoint (--model PATH)")
    if images is None:
        raise VisionSetupError(f"{where}: the real model encodes no images; pass --model a vision-language checkpoint "
                               "whose images the engine encodes (Gemma 3, InternVL, LLaVA, LLaVA-NeXT, LLaVA-OneVision, Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Mistral 3)")
    images.check(workload)
