"""Length distributions for prompts and outputs, selected in YAML by ``type``.

Every distribution yields integer lengths >= 1 and accepts optional ``min``/``max`` clipping, applied
after drawing (so ``lognormal`` with ``max: 4096`` piles the tail onto 4096 rather than renormalizing:
that is what a server's length limit does to real traffic). ``trace`` takes the lengths from the
workload's trace; the generator supplies them and only the clipping happens here.

Draws are vectorized and consume the random stream one value per request in request order, so the
first k lengths of a longer stream equal the lengths of a stream of k (see generator.py for why that
matters to sweeps).
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import numpy as np
from pydantic import (
    Field,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from workloads.errors import problems_error
from workloads.schema_base import SchemaModel

# Keeps float draws from the far tail of a heavy distribution inside int64 when cast.
LENGTH_CEILING = 2**31 - 1


class LengthDistribution(SchemaModel):
    """Common clipping bounds; subclasses add ``type`` and their parameters."""

    min: PositiveInt | None = None
    max: PositiveInt | None = None

    @field_validator("max")
    @classmethod
    def _max_not_below_min(cls, value: int | None, info: ValidationInfo) -> int | None:
        lower = info.data.get("min")
        if value is not None and lower is not None and value < lower:
            raise ValueError(f"must be >= min ({lower})")
        return value

    def lower_bound(self) -> int:
        return self.min if self.min is not None else 1

    def upper_bound(self) -> int | None:
        """The largest length this distribution can produce, or None when unbounded."""
        return self.max

    def clip(self, lengths: np.ndarray) -> np.ndarray:
        upper = self.max if self.max is not None else LENGTH_CEILING
        return np.clip(np.rint(np.asarray(lengths, dtype=np.float64)), self.lower_bound(), upper).astype(np.int64)

    def sample(self, rng: np.random.Generator, count: int) -> np.ndarray:
        return self.clip(self._draw(rng, count))

    def _draw(self, rng: np.random.Generator, count: int) -> np.ndarray:
        raise NotImplementedError


class ConstantLength(LengthDistribution):
    type: Literal["constant"]
    value: PositiveInt

    def upper_bound(self) -> int:
        return int(self.clip(np.array([self.value]))[0])

    def _draw(self, rng: np.random.Generator, count: int) -> np.ndarray:
        return np.full(count, self.value)


class UniformLength(LengthDistribution):
    """Integers uniform on [min, max], both inclusive; here min and max are the range, so required."""

    type: Literal["uniform"]
    min: PositiveInt
    max: PositiveInt

    def _draw(self, rng: np.random.Generator, count: int) -> np.ndarray:
        return rng.integers(self.min, self.max + 1, size=count)


class NormalLength(LengthDistribution):
    type: Literal["normal"]
    mean: PositiveFloat
    std: NonNegativeFloat

    def _draw(self, rng: np.random.Generator, count: int) -> np.ndarray:
        return rng.normal(self.mean, self.std, size=count)


class LognormalLength(LengthDistribution):
    """``mean`` is the arithmetic mean in tokens (before clipping); ``sigma`` the std of log(length).

    Users think in average lengths, so we take the mean and derive the log-space location:
    mu = ln(mean) - sigma^2 / 2. The median is then mean * exp(-sigma^2 / 2).
    """

    type: Literal["lognormal"]
    mean: PositiveFloat
    sigma: NonNegativeFloat

    def _draw(self, rng: np.random.Generator, count: int) -> np.ndarray:
        location = math.log(self.mean) - self.sigma**2 / 2
        return rng.lognormal(location, self.sigma, size=count)


class ExponentialLength(LengthDistribution):
    type: Literal["exponential"]
    mean: PositiveFloat

    def _draw(self, rng: np.random.Generator, count: int) -> np.ndarray:
        return rng.exponential(self.mean, size=count)


class ChoiceLength(LengthDistribution):
    """One of ``values``, with optional ``weights`` (uniform when absent)."""

    type: Literal["choice"]
    values: list[PositiveInt] = Field(min_length=1)
    weights: list[NonNegativeFloat] | None = None

    @model_validator(mode="after")
    def _weights_match_values(self) -> ChoiceLength:
        if self.weights is not None:
            if len(self.weights) != len(self.values):
                raise problems_error([("weights", f"needs one entry per value ({len(self.values)})", self.weights)])
            if sum(self.weights) <= 0:
                raise problems_error([("weights", "must not all be zero", self.weights)])
        return self

    def upper_bound(self) -> int:
        return int(self.clip(np.array([max(self.values)]))[0])

    def _draw(self, rng: np.random.Generator, count: int) -> np.ndarray:
        weights = np.ones(len(self.values)) if self.weights is None else np.asarray(self.weights, dtype=np.float64)
        cumulative = np.cumsum(weights / weights.sum())
        # One uniform per request then a lookup: keeps the one-draw-per-request property.
        picks = np.searchsorted(cumulative, rng.random(count), side="right")
        return np.asarray(self.values)[np.minimum(picks, len(self.values) - 1)]


class TraceLength(LengthDistribution):
    """Lengths read from ``workload.trace``, clipped to ``min``/``max`` if given."""

    type: Literal["trace"]

    def _draw(self, rng: np.random.Generator, count: int) -> np.ndarray:
        raise TypeError("trace lengths come from the trace; the generator reads them")


LengthSpec = Annotated[
    ConstantLength | UniformLength | NormalLength | LognormalLength | ExponentialLength | ChoiceLength | TraceLength,
    Field(discriminator="type"),
]
