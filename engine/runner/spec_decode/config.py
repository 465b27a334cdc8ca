"""vLLM's ``speculative_config`` for the real engine: which proposer, how many drafts, its settings.

Only the n-gram proposer ("prompt lookup decoding") runs here: it needs no second model. A draft model
or EAGLE head would be a second forward per step, which this runner does not have; the simulator prices
those (``engine.speculative_decoding.method: draft_model``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.core.json_options import json_object_option

METHODS = ("ngram",)
_KEYS = ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max")


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    num_speculative_tokens: int
    method: str = "ngram"
    # The n-gram lengths tried, longest first: the last n tokens are looked up earlier in the sequence.
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 5

    def __post_init__(self) -> None:
        def require(ok: bool, key: str, requirement: str) -> None:
            if not ok:
                raise ValueError(f"speculative_config.{key} must be {requirement}, got {getattr(self, key)!r}")

        def positive(value: object) -> bool:
            return isinstance(value, int) and not isinstance(value, bool) and value >= 1

        require(self.method in METHODS, "method", f"one of {', '.join(METHODS)} (the real engine has no draft "
                                                  "model or EAGLE head)")
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
        return cls(**value)
