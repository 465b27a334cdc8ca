"""``workload.sessions``: multi-turn conversations, each turn sent when the previous answer is read.

A session is a conversation. Its first turn is an ordinary request of the stream (its arrival time,
prompt and output drawn as for any request); each later turn is sent ``think_time_s`` after the
previous turn finishes, and its prompt is the whole conversation so far (the previous turn's prompt
and generated tokens) followed by ``user_len`` new tokens. That is how a chat client resends its
history, and it is what makes prefix caching pay across turns: a real run and a simulation both find
the earlier turns' blocks in the cache, if they are still there.

With sessions, ``num_requests`` / ``duration_s`` and ``arrival`` count and time the sessions' first
turns; the run holds every turn. A session ends early when its next turn would not fit the total
length cap (``max_total_len`` / ``engine.max_model_len``), as a client whose context window is full.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import numpy as np
from pydantic import Field, NonNegativeFloat, PositiveFloat, model_validator

from workloads.distributions import LengthSpec, TraceLength
from workloads.errors import problems_error
from workloads.schema_base import SchemaModel


class ConstantThinkTime(SchemaModel):
    type: Literal["constant"]
    value: NonNegativeFloat

    def sample(self, rng: np.random.Generator, count: int) -> np.ndarray:
        return np.full(count, float(self.value))


class ExponentialThinkTime(SchemaModel):
    type: Literal["exponential"]
    mean: PositiveFloat

    def sample(self, rng: np.random.Generator, count: int) -> np.ndarray:
        return rng.exponential(self.mean, size=count)


class UniformThinkTime(SchemaModel):
    """Seconds uniform on [min, max]."""

    type: Literal["uniform"]
    min: NonNegativeFloat
    max: NonNegativeFloat

    @model_validator(mode="after")
    def _ordered(self) -> UniformThinkTime:
        if self.max < self.min:
            raise problems_error([("max", f"must be >= min ({self.min:g})", self.max)])
        return self

    def sample(self, rng: np.random.Generator, count: int) -> np.ndarray:
        return rng.uniform(self.min, self.max, size=count)


class LognormalThinkTime(SchemaModel):
    """``mean`` in seconds (arithmetic); ``sigma`` the std of log(seconds), as LognormalLength."""

    type: Literal["lognormal"]
    mean: PositiveFloat
    sigma: NonNegativeFloat

    def sample(self, rng: np.random.Generator, count: int) -> np.ndarray:
        return rng.lognormal(math.log(self.mean) - self.sigma**2 / 2, self.sigma, size=count)


ThinkTimeSpec = Annotated[
    ConstantThinkTime | ExponentialThinkTime | UniformThinkTime | LognormalThinkTime, Field(discriminator="type")
]


class SessionSection(SchemaModel):
    """``turns``: turns per session, the first included (a length distribution: constant, uniform, choice, ...);
    ``user_len``: the new tokens a later turn adds to the conversation; ``think_time_s``: seconds from a
    turn's last token to the next turn's arrival. Later turns' output lengths are drawn from the stream's
    ``output_len``."""

    turns: LengthSpec
    user_len: LengthSpec
    think_time_s: ThinkTimeSpec = Field(default_factory=lambda: ConstantThinkTime(type="constant", value=0.0))

    @model_validator(mode="after")
    def _no_trace_lengths(self) -> SessionSection:
        for name in ("turns", "user_len"):
            if isinstance(getattr(self, name), TraceLength):
                raise problems_error([(f"{name}.type", "cannot be trace: a trace row is one request, not a "
                                       "conversation", "trace")])
        return self
