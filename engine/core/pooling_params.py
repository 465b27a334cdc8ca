"""Pooling parameters: what an embedding request asks of its prompt's hidden states (vLLM's names).

A pooling request is prompt-only: the runner pools the final hidden states (after the last norm, before
the LM head) of its prompt into one vector, and the request ends with it. How the positions are pooled is
the engine's choice (``PoolerConfig.pooling_type``, one per engine as in vLLM, where it is the model's);
the engine writes it into each request's ``PoolingParams`` when the request is added, so the runner reads
everything from the request.

Pure Python: the core stores these and the KV-cache manager reads ``skip_reading_prefix_cache``.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.json_options import json_object_option

# vLLM's sequence pooling types: the last prompt token (decoder embedding models' default), the mean over
# every prompt position, or the first one (CLS).
POOLING_TYPES = ("LAST", "MEAN", "CLS")


def _is_positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@dataclass
class PoolerConfig:
    """The engine's pooler (vLLM's ``--pooler-config``): ``pooling_type`` and the default ``normalize``."""
    pooling_type: str = "LAST"
    normalize: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.pooling_type, str):
            self.pooling_type = self.pooling_type.upper()
        if self.pooling_type not in POOLING_TYPES:
            raise ValueError(f"pooler_config.pooling_type must be one of {list(POOLING_TYPES)}, "
                             f"got {self.pooling_type!r}")
        if not isinstance(self.normalize, bool):
            raise ValueError(f"pooler_config.normalize must be true or false, got {self.normalize!r}")

    @classmethod
    def parse(cls, value: "PoolerConfig | dict | str | None") -> "PoolerConfig":
        """A PoolerConfig from itself, a dict, its JSON text (the CLI's), or None (the defaults)."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        value = json_object_option(value, "pooler_config", ("pooling_type", "normalize"))
        return cls(**value)


@dataclass
class PoolingParams:
    """``dimensions``: keep the first k components (Matryoshka embeddings), renormalized when normalizing.
    ``normalize``: L2-normalize the vector (None: the engine's ``PoolerConfig.normalize``, True by default).
    ``pooling_type``: set by the engine from its PoolerConfig when the request is added."""
    dimensions: int | None = None
    normalize: bool | None = None
    pooling_type: str | None = None

    def __post_init__(self) -> None:
        if self.dimensions is not None and not _is_positive_int(self.dimensions):
            raise ValueError(f"PoolingParams.dimensions must be None or an integer >= 1, got {self.dimensions!r}")
        if self.normalize is not None and not isinstance(self.normalize, bool):
            raise ValueError(f"PoolingParams.normalize must be None, True or False, got {self.normalize!r}")
        if self.pooling_type is not None and self.pooling_type not in POOLING_TYPES:
            raise ValueError(f"PoolingParams.pooling_type must be one of {list(POOLING_TYPES)}, "
                             f"got {self.pooling_type!r}")

    @property
    def skip_reading_prefix_cache(self) -> bool:
        """MEAN and CLS pool positions a prefix-cache hit would skip (their hidden states are never computed);
        LAST needs only the last prompt position, which a hit always leaves to compute."""
        return self.pooling_type in ("MEAN", "CLS")
