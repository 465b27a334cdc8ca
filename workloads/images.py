"""``workload.images``: requests that show images to a vision-language model, and which images they show.

A vision-language model (Gemma 3, LLaVA, Qwen2-VL) turns each image into a run of placeholder tokens in the
prompt, which its vision encoder's output fills: a 256-token run per image for Gemma 3, 576 for LLaVA-1.5, and
for Qwen2-VL as many as the image's resolution gives. What decides the timing is how many images a request
shows, how many tokens each takes, and how often the same image comes back: a repeated image is encoded once
while the engine keeps its output, and its KV is a prefix-cache hit when what comes before it is shared too
(engine/core/encoder_cache_manager.py).

The images of a request come right after its leading tokens (its shared prefix or trace blocks), one after the
other, and its text follows: a system prompt, the pictures, then the question, as chat templates lay them out.
``prompt_len`` counts the text; the images' tokens come on top (``max_total_len`` caps the sum with the output).

Draws use their own random streams, so adding images leaves arrivals, lengths and text tokens as they were
(the text's token ids aside: the placeholder id is kept out of the text).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import Field, PositiveInt, field_validator

from workloads.popularity import parse_popularity, pick_by_weights, popularity_weights
from workloads.distributions import ConstantLength, LengthSpec, TraceLength
from workloads.random_streams import Stream, random_stream
from workloads.schema_base import SchemaModel

# More distinct images than this in one workload is a typo (every image unique needs no pool: distinct: null).
MAX_DISTINCT_IMAGES = 10_000_000


class ImageSection(SchemaModel):
    """- ``fraction``: the share of requests that show images (the others are text only).
    - ``count``: images per request that shows any (a length distribution; default: one).
    - ``tokens_per_image``: each image's placeholder tokens (a length distribution). null: the model's vision
      encoder's fixed count (Gemma 3 256, LLaVA-1.5 576); a model whose count depends on the resolution
      (Qwen2-VL) needs it set.
    - ``distinct``: null: every image is new. N: images are drawn from a pool of N, each with its own size.
    - ``popularity``: how the pool's images are drawn: ``uniform``, or ``{zipf: s}`` (image i with probability
      proportional to ``1 / (i + 1) ** s``, s > 0).
    """

    fraction: float = Field(default=1.0, ge=0, le=1)
    count: LengthSpec = Field(default_factory=lambda: ConstantLength(type="constant", value=1))
    tokens_per_image: LengthSpec | None = None
    distinct: PositiveInt | None = Field(default=None, le=MAX_DISTINCT_IMAGES)
    popularity: Literal["uniform"] | dict[str, float] = "uniform"

    @field_validator("count", "tokens_per_image")
    @classmethod
    def _not_from_a_trace(cls, value: Any) -> Any:
        if isinstance(value, TraceLength):
            raise ValueError("cannot be type trace: no trace column says how many images a request shows")
        return value

    @field_validator("popularity", mode="before")
    @classmethod
    def _popularity(cls, value: Any) -> Any:
        return parse_popularity(value, ("uniform",), "image i drawn")

    def largest_image(self, default_tokens: int | None) -> int | None:
        """The most placeholder tokens one image can take (None: unbounded, or not known without the model)."""
        if self.tokens_per_image is None:
            return default_tokens
        return self.tokens_per_image.upper_bound()

    def draw(self, seed: int, count: int, default_tokens: int | None) -> list[tuple[tuple[str, int], ...]]:
        """Per request, its images as (identifier, placeholder tokens), in prompt order; () for a text request.

        An image's identifier names it within the stretch drawn with ``seed`` (a pool image is the same image in
        every request that draws it, with the same size; an unpooled one is seen once)."""
        if self.tokens_per_image is None and default_tokens is None:
            raise ValueError("tokens_per_image must be set: the model's vision encoder has no fixed count per image")
        rng = random_stream(seed, Stream.IMAGES)
        shows = rng.random(count) < self.fraction
        counts = np.where(shows, self.count.sample(rng, count), 0)
        total = int(counts.sum())
        size_rng = random_stream(seed, Stream.IMAGE_SIZES)

        def sizes(number: int) -> np.ndarray:
            if self.tokens_per_image is None:
                return np.full(number, default_tokens, dtype=np.int64)
            return self.tokens_per_image.sample(size_rng, number)

        tag = f"{seed & 0xFFFFFFFFFFFF:x}"
        if self.distinct is None:
            names = [f"image-{tag}-{index}" for index in range(total)]
            lengths = sizes(total).tolist()
        else:
            pool_sizes = sizes(self.distinct)
            picks = pick_by_weights(popularity_weights(self.popularity, self.distinct), rng.random(total))
            names = [f"image-{tag}-p{index}" for index in picks.tolist()]
            lengths = pool_sizes[picks].tolist()
        drawn: list[tuple[tuple[str, int], ...]] = []
        position = 0
        for number in counts.tolist():
            drawn.append(tuple(zip(names[position:position + number], lengths[position:position + number])))
            position += number
        return drawn
