"""``workload.lora``: requests that run with LoRA adapters (multi-LoRA serving), and which adapter each picks.

Multi-LoRA serving puts many fine-tuned variants of one base model behind one engine: each request names an
adapter, and the engine batches requests of different adapters together (vLLM's ``--enable-lora``, Punica,
S-LoRA). What decides its timing is how many adapters there are, how popular each is (a few hot adapters fit
the device's slots; a long tail keeps loading), their rank and the layers they adapt.

Adapter ``i`` (0-based) is named ``adapter-i`` with the runner's id ``i + 1`` (0 is the base model), in every
section that names it: a request class or a phase with its own ``lora:`` draws from the same adapters, and
must then give them the same rank and modules (WorkloadConfig checks it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from workloads.errors import problems_error
from workloads.popularity import parse_popularity, pick_by_weights, popularity_weights
from workloads.schema_base import SchemaModel

# The projections of a Llama-family layer a LoRA adapter may adapt (PEFT's target_modules names).
LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# vLLM's allowed max_lora_rank values (its LoRAConfig refuses any other).
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# More distinct adapters than this in one workload is a typo, not a deployment (S-LoRA served 2,000).
MAX_ADAPTERS = 100_000


def adapter_name(index: int) -> str:
    """The name of adapter ``index`` (0-based): what requests.parquet's ``lora_name`` column holds."""
    return f"adapter-{index}"


@dataclass(frozen=True, slots=True)
class AdapterSpec:
    """One adapter as the simulator prices it: its name, the runner's id, its rank and the modules it adapts."""

    name: str
    int_id: int
    rank: int
    target_modules: tuple[str, ...]


class LoRASection(SchemaModel):
    """- ``adapters``: how many distinct adapters requests pick from (``adapter-0`` .. ``adapter-{adapters-1}``).
    - ``rank``: every adapter's rank, or a list cycled over the adapters (adapter i gets ``rank[i % len]``);
      each at most ``engine.max_lora_rank``.
    - ``popularity``: ``uniform``, or ``{zipf: s}``: adapter i is picked with probability proportional to
      ``1 / (i + 1) ** s`` (adapter-0 the most popular; s > 0); or ``trace``: the adapter the stream's trace names
      in its ``lora_adapter`` column for the request's row (empty: the base model).
    - ``base_model_fraction``: the share of requests that run on the base model, without an adapter (0 with
      ``trace``, whose rows say it).
    - ``target_modules``: the projections each adapter adapts (PEFT's names).
    """

    adapters: int = Field(ge=1, le=MAX_ADAPTERS)
    rank: int | list[int] = 16
    popularity: Literal["uniform", "trace"] | dict[str, float] = "uniform"
    base_model_fraction: float = Field(default=0.0, ge=0, le=1)
    target_modules: list[str] = Field(default_factory=lambda: list(LORA_TARGET_MODULES), min_length=1)

    @field_validator("rank", mode="before")
    @classmethod
    def _ranks(cls, value: Any) -> Any:
        def bad(entry: Any) -> bool:
            return isinstance(entry, bool) or not isinstance(entry, int) or not 1 <= entry <= max(LORA_RANKS)

        if isinstance(value, list):
            if not value:
                raise ValueError("must list at least one rank")
            wrong = [f"[{index}] {entry!r}" for index, entry in enumerate(value) if bad(entry)]
            if wrong:
                raise ValueError(f"every rank must be an integer in 1..{max(LORA_RANKS)}; not {', '.join(wrong)}")
            return value
        if bad(value):
            raise ValueError(f"must be an integer in 1..{max(LORA_RANKS)}, or a list of them cycled over the adapters")
        return value

    @field_validator("popularity", mode="before")
    @classmethod
    def _popularity(cls, value: Any) -> Any:
        return parse_popularity(value, ("uniform", "trace"), "adapter i picked")

    @field_validator("target_modules")
    @classmethod
    def _known_modules(cls, value: list[str]) -> list[str]:
        unknown = [name for name in value if name not in LORA_TARGET_MODULES]
        if unknown:
            raise ValueError(f"names unknown modules {unknown}; choose from {', '.join(LORA_TARGET_MODULES)}")
        if len(set(value)) != len(value):
            raise ValueError("must not repeat a module")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> LoRASection:
        problems = []
        if isinstance(self.rank, list) and len(self.rank) > self.adapters:
            problems.append(("rank", f"lists {len(self.rank)} ranks for {self.adapters} adapters; the ones past the last "
                             "adapter would never be used", self.rank))
        if self.popularity == "trace" and self.base_model_fraction:
            problems.append(("base_model_fraction", "must be 0 with popularity: trace (the trace's empty lora_adapter "
                             "cells are the base-model requests)", self.base_model_fraction))
        if problems:
            raise problems_error(problems)
        return self

    def rank_of(self, index: int) -> int:
        return self.rank[index % len(self.rank)] if isinstance(self.rank, list) else self.rank

    def max_rank(self) -> int:
        return max(self.rank) if isinstance(self.rank, list) else self.rank

    def adapter_specs(self) -> list[AdapterSpec]:
        modules = tuple(self.target_modules)
        return [AdapterSpec(adapter_name(index), index + 1, self.rank_of(index), modules) for index in range(self.adapters)]

    def probabilities(self) -> np.ndarray:
        weights = popularity_weights(self.popularity, self.adapters)
        return weights / weights.sum()

    def pick(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """Each of ``count`` requests' adapter index, or -1 for the base model. One (base?, which) pair of
        uniforms per request, row by row, so request i's pick does not depend on how many requests there are."""
        uniforms = rng.random((count, 2))
        picks = pick_by_weights(self.probabilities(), uniforms[:, 1])
        return np.where(uniforms[:, 0] < self.base_model_fraction, -1, picks)
