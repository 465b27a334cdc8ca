"""Speculative decoding in the simulator: how many drafts a verification accepts, and what proposing costs.

Acceptance. The i-th draft of a verification is accepted with ``acceptance_by_position[i]`` when the drafts
before it were, and the first rejection ends the run of accepted drafts (vLLM's rejection sampler keeps the
longest accepted prefix). Each draw is a function of (workload seed, request id, the draft's position in the
sequence) alone, so a run is reproducible and a request's acceptances do not depend on which other requests
share its steps. A position is verified once (a rejected draft's position next holds the token sampled in
its place, and later drafts sit past it), except when a preempted request recomputes: it then draws what
it drew before.

Proposals. A proposer offers ``num_speculative_tokens`` drafts unless ``proposal_by_position`` says otherwise
(an n-gram lookup, which finds nothing when the sequence's tail never occurred before, and fewer tokens when it
occurred near the end): it offers the i-th draft with ``proposal_by_position[i]`` when it offered those before
it. Drawn like acceptance, from (seed, request id, the draft's position) on a stream of its own, so the two are
independent and a run without ``proposal_rate`` draws exactly the acceptances it drew before.

Proposing, added to the step's time after the verification pass (vLLM proposes once the step has sampled,
before the engine can schedule the next step):

* ``ngram`` (prompt lookup): ``NGRAM_PROPOSE_S_PER_REQUEST`` of CPU time per request that sampled. vLLM
  matches the last tokens against the request's history in a compiled (numba) kernel, microseconds per
  request; the constant is an assumption, not a measurement.
* ``draft_model``: the draft model's forward passes on the same GPUs, each priced by an analytical cost model
  of the draft (its GPU time: the engine's own step overhead is the target step's, paid once). As vLLM's
  draft proposers run them:

      draft_s = T_draft(the step's batch) + sum over i = 1 .. k - 1 of T_draft(decode of n requests at i)

  The first pass runs the draft over the step's own tokens (prompt chunks, the verified positions), which
  fills its KV cache and yields each sampling request's first draft; it is priced on the target step's
  features, so its logits are counted at every verified position where vLLM computes one row per request
  (a small over-count). Each later pass is a decode of the n requests that sampled, one token each, reading
  their sequences so far plus the i drafts before (``decode_features``).
* ``mtp``: the model's own multi-token-prediction module (DeepSeek-V3/R1; ``sim/mtp_draft.py``), priced as a
  one-layer draft model of the target's shape, quantized as the target is, the same way.
* ``eagle`` and ``eagle3``: an EAGLE or EAGLE-3 head (``sim/eagle_draft.py``), priced as a one-layer dense draft
  model at the target's width, scoring over the target's vocabulary (eagle) or its own smaller one (eagle3), the
  same way.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from sim.cost_models import AnalyticalCostModel, StepFeatures
from workloads.random_streams import Stream, stream_seed

# CPU seconds the n-gram proposer takes per request and step (an assumption; see the module docstring).
NGRAM_PROPOSE_S_PER_REQUEST = 5e-6

_MASK64 = (1 << 64) - 1
_GOLDEN_GAMMA = 0x9E3779B97F4A7C15
_TWO_TO_64 = float(1 << 64)


def _unit_interval(key: int, position: int) -> float:
    """A uniform draw in [0, 1) from (key, position): SplitMix64's output for that state, which mixes every
    input bit into every output bit, so neighbouring positions draw independently."""
    z = (key + (position + 1) * _GOLDEN_GAMMA) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) / _TWO_TO_64


@dataclass(frozen=True)
class SpeculationSetup:
    """Everything the simulated executor needs to speculate, resolved from ``engine.speculative_decoding``."""
    num_speculative_tokens: int
    # acceptance_by_position[i]: P(the i-th draft is accepted | the drafts before it were).
    acceptance_by_position: tuple[float, ...]
    method: str
    seed: int
    # The draft model's cost on the target's hardware (every method but ngram), else None.
    draft_cost_model: AnalyticalCostModel | None = None
    # proposal_by_position[i]: P(the proposer offers an i-th draft | it offered the ones before); () = always all.
    proposal_by_position: tuple[float, ...] = ()
    # An n-gram lookup's CPU seconds per request that sampled: the assumption below, or a calibrated profile's fit.
    ngram_propose_s_per_request: float = NGRAM_PROPOSE_S_PER_REQUEST

    def __post_init__(self) -> None:
        if len(self.acceptance_by_position) != self.num_speculative_tokens:
            raise ValueError(f"acceptance_by_position has {len(self.acceptance_by_position)} entries for "
                             f"num_speculative_tokens {self.num_speculative_tokens}")
        if (self.method != "ngram") != (self.draft_cost_model is not None):
            raise ValueError(f"method {self.method!r} with draft_cost_model {self.draft_cost_model!r}")
        if self.proposal_by_position and len(self.proposal_by_position) != self.num_speculative_tokens:
            raise ValueError(f"proposal_by_position has {len(self.proposal_by_position)} entries for "
                             f"num_speculative_tokens {self.num_speculative_tokens}")

    @property
    def always_proposes_all(self) -> bool:
        return all(rate >= 1.0 for rate in self.proposal_by_position)

    def describe(self) -> dict:
        """For summary.json's config: the proposer and its cost."""
        described = {"num_speculative_tokens": self.num_speculative_tokens,
                     "acceptance_by_position": list(self.acceptance_by_position), "method": self.method}
        if not self.always_proposes_all:
            described["proposal_by_position"] = list(self.proposal_by_position)
        if self.draft_cost_model is None:
            described["ngram_propose_s_per_request"] = self.ngram_propose_s_per_request
        else:
            draft = self.draft_cost_model
            described["draft_model"] = draft.model.name
            described["draft_weight_read_s"] = draft.describe()["weight_read_s"]
        return described


class PositionDraws:
    """Runs of successes drawn per (request, sequence position) on one random stream: how many of a
    verification's drafts are accepted, or how many drafts a proposal offers (see the module docstring)."""

    def __init__(self, seed: int, stream: Stream) -> None:
        base = stream_seed(seed, stream).generate_state(2, dtype="uint32")
        self._base = int(base[0]).to_bytes(4, "little") + int(base[1]).to_bytes(4, "little")
        # Each live request's 64-bit key (forgotten when it finishes: a long run sees many requests).
        self._keys: dict[str, int] = {}

    def forget(self, request_ids) -> None:
        keys = self._keys
        for request_id in request_ids:
            keys.pop(request_id, None)

    def run_length(self, request_id: str, first_position: int, rates: tuple[float, ...], limit: int) -> int:
        """How many of ``limit`` trials, the i-th at sequence position ``first_position + i`` with success
        probability ``rates[i]``, succeed before the first failure."""
        key = self._keys.get(request_id)
        if key is None:
            digest = hashlib.blake2b(request_id.encode(), digest_size=8, key=self._base).digest()
            key = self._keys[request_id] = int.from_bytes(digest, "little")
        for index in range(limit):
            if _unit_interval(key, first_position + index) >= rates[index]:
                return index
        return limit


class AcceptanceDraws(PositionDraws):
    """How many of a verification's drafts are accepted."""

    def __init__(self, setup: SpeculationSetup) -> None:
        super().__init__(setup.seed, Stream.SPECULATIVE_ACCEPTANCE)
        self.acceptance_by_position = setup.acceptance_by_position

    def num_accepted(self, request_id: str, first_draft_position: int, num_drafts: int) -> int:
        """Accepted drafts of ``num_drafts`` whose first sits at sequence position ``first_draft_position``."""
        return self.run_length(request_id, first_draft_position, self.acceptance_by_position, num_drafts)


class ProposalDraws(PositionDraws):
    """How many drafts a proposal offers (a proposer that always offers all needs none of this)."""

    def __init__(self, setup: SpeculationSetup) -> None:
        super().__init__(setup.seed, Stream.SPECULATIVE_PROPOSALS)
        self.proposal_by_position = setup.proposal_by_position
        self.num_speculative_tokens = setup.num_speculative_tokens

    def num_offered(self, request_id: str, first_draft_position: int) -> int:
        """Drafts offered for a request whose first draft would sit at sequence position ``first_draft_position``."""
        return self.run_length(request_id, first_draft_position, self.proposal_by_position,
                               self.num_speculative_tokens)


def proposer_seconds(setup: SpeculationSetup, features: StepFeatures, num_sampling: int,
                     sampled_context_tokens: int, longest_sequence: int) -> float:
    """What proposing the next drafts adds to a step whose target pass has ``features``: ``num_sampling``
    requests sampled, whose sequences (their KV once this step is done) sum to ``sampled_context_tokens``
    tokens, the longest ``longest_sequence``."""
    draft = setup.draft_cost_model
    if draft is None:
        return num_sampling * setup.ngram_propose_s_per_request
    seconds = draft.step_time_from_features(features) - draft.engine_overhead_s(features)
    if num_sampling:
        for index in range(1, setup.num_speculative_tokens):
            step = decode_features(num_sampling, sampled_context_tokens + index * num_sampling,
                                   longest_sequence + index)
            seconds += draft.step_time_from_features(step) - draft.engine_overhead_s(step)
    return seconds


def decode_features(num_requests: int, context_tokens: int, max_seq_len: int) -> StepFeatures:
    """A decode-only step of ``num_requests`` requests that read ``context_tokens`` KV tokens in all."""
    return StepFeatures(num_reqs=num_requests, num_tokens=num_requests, num_prefill_reqs=0, num_prefill_tokens=0,
                        num_decode_reqs=num_requests, decode_context_tokens=context_tokens, prefill_context_tokens=0,
                        prefill_attention_work=0, max_seq_len=max_seq_len)
