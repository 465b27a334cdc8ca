"""vLLM's ``speculative_config`` for the real engine: which proposer, how many drafts, its settings.

Three proposers run here: ``ngram`` (prompt lookup decoding: no second model), ``draft_model`` (a smaller
checkpoint of the same vocabulary, ``model``: draft_model.py), ``eagle`` and ``eagle3`` (an EAGLE or EAGLE-3 head over
the target's features, ``model``: eagle.py). As in vLLM, giving ``model`` without ``method`` means ``draft_model``. MTP
modules are priced by the simulator only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.core.json_options import json_object_option

METHODS = ("ngram", "draft_model", "eagle", "eagle3")
MODEL_METHODS = ("draft_model", "eagle", "eagle3")  # the proposers that run a checkpoint of their own
_KEYS = ("method", "model", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max")


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    num_speculative_tokens: int
    method: str = "ngram"
    # The draft model's checkpoint folder (or "tiny" / "small", the generated defaults), for method draft_model.
    model: str | None = None
    # The n-gram lengths tried, longest first: the last n tokens are looked up earlier in the sequence.
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 5

    def __post_init__(self) -> None:
        def require(ok: bool, key: str, requirement: str) -> None:
            if not ok:
                raise ValueError(f"speculative_config.{key} must be {requirement}, got {getattr(self, key)!r}")

        def positive(value: object) -> bool:
            return isinstance(value, int) and not isinstance(value, bool) and value >= 1

        require(self.method in METHODS, "method", f"one of {', '.join(METHODS)} (the real engine has no MTP "
                                                  "module)")
        require((self.model is not None) == (self.method in MODEL_METHODS), "model",
                "the checkpoint of a draft model or EAGLE head for methods draft_model, eagle and eagle3, and "
                "nothing for ngram")
        require(self.model is None or isinstance(self.model, str) and self.model, "model", "a path")
        require(positive(self.num_speculative_tokens), "num_speculative_tokens", "an integer >= 1")
        require(positive(self.prompt_lookup_min), "prompt_lookup_min", "an integer >= 1")
        require(positive(self.prompt_lookup_max) and self.prompt_lookup_max >= self.prompt_lookup_min,
                "prompt_lookup_max", f"an integer >= prompt_lookup_min ({self.prompt_lookup_min})")

    @classmethod
    def parse(cls, value: SpeculativeConfig | dict[str, Any] | str | None) -> SpeculativeConfig | None:
        """From a config, a dict, or vLLM's CLI form (a JSON object); None stays None."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        value = json_object_option(value, "speculative_config", _KEYS)
        if "num_speculative_tokens" not in value:
            raise ValueError("speculative_config needs num_speculative_tokens")
        if value.get("model") is not None and "method" not in value:
            value = {**value, "method": "draft_model"}  # vLLM's reading of a bare model
        return cls(**value)

    @property
    def num_lookahead_tokens(self) -> int:
        """KV slots past each chunk the proposer writes into before the next step (draft_model.py, eagle.py)."""
        return self.num_speculative_tokens if self.method in MODEL_METHODS else 0
