"""``engine.speculative_decoding``: drafts proposed each step and verified in the next (simulated).

vLLM's ``--speculative-config``, reduced to what decides a simulated run's timing: how many draft tokens a
decode carries (``num_speculative_tokens``), how likely each is accepted (``acceptance_rate``), and what
proposing them costs (``method``: an n-gram lookup on the CPU, a smaller ``draft_model`` on the GPU, the
model's own multi-token-prediction layer, ``mtp``, or an EAGLE head, ``eagle`` and ``eagle3``).
The simulator draws acceptances; it never looks at token values (sim/speculative_executor.py).
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from workloads.errors import problems_error
from workloads.schema_base import SchemaModel

# More drafts than this per step is not a configuration anyone serves with (vLLM's own examples stop at 5-8);
# the bound keeps a typo (30 for 3) from silently simulating something absurd.
MAX_SPECULATIVE_TOKENS = 32


class SpeculativeDecodingSection(SchemaModel):
    """- ``num_speculative_tokens``: drafts per decode; 0 is off (so a sweep over it can include the baseline).
    - ``acceptance_rate``: one probability in (0, 1], each draft accepted independently with it until the
      first rejection; or one per position, the probability that the i-th draft is accepted when those
      before it were (what vLLM reports as per-position acceptance). A list needs an entry for every
      position up to ``num_speculative_tokens``; entries past it are unused (so one measured list serves a
      sweep over ``num_speculative_tokens``).
    - ``proposal_rate``: ``ngram`` only, default 1 (always ``num_speculative_tokens`` drafts): one probability in
      (0, 1] or one per position, the probability that the proposer offers an i-th draft when it offered the ones
      before it (i = 0: that it offers any). A prompt lookup finds nothing when the sequence's tail never occurred
      before, and fewer than k tokens when it occurred near the end; real runs report the measured list
      (``proposal_rate_per_position``). A draft model or head always offers k.
    - ``method``: ``ngram`` (prompt lookup, a little CPU time per request and step), ``draft_model``, ``mtp``
      (the model's own multi-token-prediction module, DeepSeek-V3/R1's: sim/mtp_draft.py), ``eagle`` or ``eagle3``
      (a one-layer EAGLE or EAGLE-3 head over the model's hidden states: sim/eagle_draft.py).
    - ``draft_vocab_size``: for ``eagle3``, the head's own vocabulary (default 32,000, the published heads').
    - ``draft_model``: for ``draft_model``, the proposer: a preset name or a config.json path, as ``model``; for
      ``eagle`` and ``eagle3``, optionally the head's checkpoint folder, which real runs load and whose config.json
      the simulator prices (without one, a head of the target's shape).
    - ``prompt_lookup_min`` / ``prompt_lookup_max``: the n-gram lengths the real runner's proposer tries (real
      runs, ``--executor real``, use them and measure the acceptance instead of assuming ``acceptance_rate``).
    """

    num_speculative_tokens: int = Field(ge=0, le=MAX_SPECULATIVE_TOKENS)
    acceptance_rate: float | list[float]
    proposal_rate: float | list[float] = 1.0
    method: Literal["ngram", "draft_model", "mtp", "eagle", "eagle3"] = "ngram"
    draft_model: str | None = Field(default=None, min_length=1)
    draft_vocab_size: int | None = Field(default=None, ge=1)
    prompt_lookup_min: int = Field(default=2, ge=1)
    prompt_lookup_max: int = Field(default=5, ge=1)

    @field_validator("acceptance_rate", "proposal_rate", mode="before")
    @classmethod
    def _probabilities(cls, value: Any) -> Any:
        # One message naming what is wrong, instead of pydantic's report per member of the union.
        def bad(entry: Any) -> bool:
            return isinstance(entry, bool) or not isinstance(entry, (int, float)) or not math.isfinite(entry) \
                or not 0 < entry <= 1

        if isinstance(value, list):
            if not value:
                raise ValueError("must list at least one probability")
            wrong = [f"[{index}] {entry!r}" for index, entry in enumerate(value) if bad(entry)]
            if wrong:
                raise ValueError(f"every per-position probability must be a number in (0, 1]; not {', '.join(wrong)}")
            return [float(entry) for entry in value]
        if bad(value):
            raise ValueError("must be a probability in (0, 1], or a list of one per draft position")
        return float(value)

    @model_validator(mode="after")
    def _consistent(self) -> SpeculativeDecodingSection:
        problems = []
        for name, rates in (("acceptance_rate", self.acceptance_rate), ("proposal_rate", self.proposal_rate)):
            if isinstance(rates, list) and len(rates) < self.num_speculative_tokens:
                problems.append((name, f"lists {len(rates)} per-position probabilities, but num_speculative_tokens "
                                 f"is {self.num_speculative_tokens}: give one per draft position", rates))
        offered = self.proposal_rate
        if self.method != "ngram" and (min(offered) if isinstance(offered, list) else offered) < 1:
            problems.append(("proposal_rate", f"is only used with method: ngram (a {self.method} proposer offers "
                             "num_speculative_tokens drafts every step)", self.proposal_rate))
        if self.method == "draft_model" and self.draft_model is None:
            problems.append(("draft_model", "method draft_model needs the draft model (a preset name or a "
                             "config.json path)", None))
        if self.prompt_lookup_max < self.prompt_lookup_min:
            problems.append(("prompt_lookup_max", f"must be >= prompt_lookup_min ({self.prompt_lookup_min})",
                             self.prompt_lookup_max))
        if self.method in ("ngram", "mtp") and self.draft_model is not None:
            problems.append(("draft_model", f"is only used with methods draft_model, eagle and eagle3 (method is "
                             f"{self.method})", self.draft_model))
        if self.method != "eagle3" and self.draft_vocab_size is not None:
            problems.append(("draft_vocab_size", f"is only used with method: eagle3 (method is {self.method})",
                             self.draft_vocab_size))
        if problems:
            raise problems_error(problems)
        return self

    @property
    def drafts_with_a_model(self) -> bool:
        """A proposer that runs a network on the GPU (a draft model, the MTP module, an EAGLE head): its passes
        cost GPU time, its layers hold KV, and its requests hold lookahead slots."""
        return self.method != "ngram"

    def acceptance_by_position(self) -> list[float]:
        """The probability that the i-th draft is accepted when those before it were, i < num_speculative_tokens."""
        return self._by_position(self.acceptance_rate)

    def proposal_by_position(self) -> list[float]:
        """The probability that the proposer offers an i-th draft when it offered those before it."""
        return self._by_position(self.proposal_rate)

    def _by_position(self, rates: float | list[float]) -> list[float]:
        if isinstance(rates, list):
            return rates[:self.num_speculative_tokens]
        return [rates] * self.num_speculative_tokens
