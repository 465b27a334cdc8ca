"""A request as the scheduler sees it: its tokens, how many are computed, and its lifecycle status.

State machine (vLLM V1's, see the seed's section 8.2):

    WAITING -> RUNNING -> (PREEMPTED -> RUNNING)* -> FINISHED_*

With KV transfer between a prefill engine and a decode engine (engine/core/kv_transfer.py), a decode
engine's request whose prompt KV comes from elsewhere waits with its blocks allocated while it loads:

    WAITING -> WAITING_FOR_REMOTE_KVS -> WAITING -> RUNNING -> ...

Invariants kept by the scheduler:
- ``all_token_ids == prompt_token_ids + output_token_ids`` and ``num_tokens == len(all_token_ids)``.
- ``0 <= num_computed_tokens <= num_tokens``; a preempted request has ``num_computed_tokens == 0``.
- ``block_hashes[i]`` is the chained hash of full block ``i`` of ``all_token_ids`` (prefix caching only).
- ``mm_features`` are sorted, disjoint placeholder runs inside the prompt (engine/core/multimodal.py).
- ``spec_token_ids`` (speculative decoding) is empty unless the request is running with all its known tokens
  but the last computed, and never runs past ``max_tokens`` or the length limit (engine/core/spec_decode.py).
"""

from __future__ import annotations

import enum
from array import array
from typing import Callable, Sequence

from engine.core.lora import LoRARequest
from engine.core.multimodal import MultiModalFeature, validate_features
from engine.core.pooling_params import PoolingParams
from engine.core.sampling_params import SamplingParams

_NEVER = 1 << 62


class RequestStatus(enum.IntEnum):
    WAITING = 0
    # Blocks allocated, its prompt's KV still arriving from the engine that computed it (vLLM's name).
    WAITING_FOR_REMOTE_KVS = 1
    RUNNING = 2
    PREEMPTED = 3
    # Every status after PREEMPTED is final.
    FINISHED_STOPPED = 4
    FINISHED_LENGTH_CAPPED = 5
    FINISHED_ABORTED = 6
    FINISHED_IGNORED = 7
    FINISHED_ERROR = 8

    @staticmethod
    def is_finished(status: "RequestStatus") -> bool:
        return status > RequestStatus.PREEMPTED


# The OpenAI-style finish reason reported for each final status.
FINISH_REASONS: dict[RequestStatus, str] = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_IGNORED: "ignored",
    RequestStatus.FINISHED_ERROR: "error",
}


class Request:
    """One generation request. Plain slots: the scheduler touches these fields on every step."""

    __slots__ = (
        "request_id", "prompt_token_ids", "sampling_params", "eos_token_id", "arrival_time", "priority",
        "cache_salt", "status", "output_token_ids", "all_token_ids", "num_prompt_tokens", "num_tokens",
        "num_computed_tokens", "num_cached_tokens", "num_preemptions", "max_tokens", "stop_reason",
        "status_message", "block_hashes", "block_hasher", "next_hash_boundary",
        "stop_token_set", "do_remote_prefill", "do_remote_decode", "num_output_placeholders", "spec_token_ids",
        "lora_request", "pooling_params", "mm_features",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int] | tuple[int, ...] | array,
        sampling_params: SamplingParams | None = None,
        *,
        eos_token_id: int | None = None,
        arrival_time: float = 0.0,
        priority: int = 0,
        cache_salt: str | None = None,
        block_hasher: Callable[["Request"], list] | None = None,
        do_remote_prefill: bool = False,
        do_remote_decode: bool = False,
        lora_request: LoRARequest | None = None,
        pooling_params: PoolingParams | None = None,
        mm_features: Sequence[MultiModalFeature] = (),
    ) -> None:
        self.request_id = request_id
        # Kept as given when already a list, tuple or array (a workload's prompts need no extra copy).
        self.prompt_token_ids = prompt_token_ids if isinstance(prompt_token_ids, (list, tuple, array)) \
            else list(prompt_token_ids)
        self.sampling_params = sampling_params if sampling_params is not None else SamplingParams()
        self.eos_token_id = eos_token_id
        self.arrival_time = arrival_time
        self.priority = priority
        self.cache_salt = cache_salt
        self.status = RequestStatus.WAITING
        self.output_token_ids: list[int] = []
        # array('q') rather than list: appends are as cheap, and block hashing reads its bytes directly.
        self.all_token_ids = array("q", self.prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self.num_tokens = self.num_prompt_tokens
        self.num_computed_tokens = 0
        # Prompt tokens served from the prefix cache at first scheduling; -1 until then.
        self.num_cached_tokens = -1
        self.num_preemptions = 0
        # None means "up to the model's length limit"; the scheduler applies that cap.
        self.max_tokens = self.sampling_params.max_tokens
        self.stop_reason: int | str | None = None
        # Why a request ended as IGNORED or ERROR, for the user.
        self.status_message: str | None = None
        self.block_hashes: list = []
        self.block_hasher = None
        # The token count at which the next block fills and must be hashed (never, without a hasher).
        self.next_hash_boundary = _NEVER
        # Tokens that may end the request (EOS unless ignore_eos, and stop_token_ids): one set lookup
        # per generated token tells whether the full stop check is needed.
        params = self.sampling_params
        stop_tokens = set(params.all_stop_token_ids)
        if eos_token_id is not None and not params.ignore_eos:
            stop_tokens.add(eos_token_id)
        self.stop_token_set = frozenset(stop_tokens)
        # Disaggregated prefill (vLLM's kv_transfer_params): on a decode engine, the prompt's KV is loaded
        # from the prefill engine instead of computed (cleared once the load starts: a request preempted
        # later is recomputed here); on a prefill engine, the blocks outlive the request until they are sent.
        self.do_remote_prefill = do_remote_prefill
        self.do_remote_decode = do_remote_decode
        # Async scheduling: tokens being sampled by batches in flight, whose positions the next batch may
        # already compute (engine/core/batches_in_flight.py). Always 0 otherwise.
        self.num_output_placeholders = 0
        # Speculative decoding: draft tokens proposed after its last sampled token, to be verified in its next
        # step. Not part of all_token_ids (never hashed nor cached) until the executor accepts them.
        self.spec_token_ids: list[int] = []
        # The LoRA adapter it runs with (engine/core/lora.py), None for the base model. Set before hashing: the
        # adapter is part of the first block's hash.
        self.lora_request = lora_request
        # An embedding request (engine/core/pooling_params.py): prompt-only, its front end asks for one token,
        # which the runner does not sample (a placeholder) and the front end drops, as it drops echo's token.
        self.pooling_params = pooling_params
        # Images (or other items) whose encoder output fills placeholder runs of the prompt
        # (engine/core/multimodal.py): scheduled with the encoder budget and cache, and part of the block hashes.
        self.mm_features = validate_features(mm_features, self.num_prompt_tokens, request_id) if mm_features else ()
        if block_hasher is not None:
            self.set_block_hasher(block_hasher)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def skip_reading_prefix_cache(self) -> bool:
        """Prefix-cache hits would skip positions whose outputs the request needs: prompt logprobs need every
        position's logits, MEAN and CLS pooling every (or the first) position's hidden state."""
        return self.sampling_params.prompt_logprobs is not None or (
            self.pooling_params is not None and self.pooling_params.skip_reading_prefix_cache)

    @property
    def is_finished(self) -> bool:
        return self.status > RequestStatus.PREEMPTED

    @property
    def finish_reason(self) -> str | None:
        return FINISH_REASONS.get(self.status)

    def set_block_hasher(self, block_hasher) -> None:
        """Attach a hasher (an object with ``block_size`` that hashes new full blocks) and hash the prompt."""
        self.block_hasher = block_hasher
        self.block_hashes = []
        if block_hasher is None:
            self.next_hash_boundary = _NEVER
        else:
            self._hash_new_full_blocks()

    def _hash_new_full_blocks(self) -> None:
        self.block_hashes.extend(self.block_hasher(self))
        self.next_hash_boundary = (len(self.block_hashes) + 1) * self.block_hasher.block_size

    def append_output_token_ids(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
        self.num_tokens += 1
        if self.num_tokens >= self.next_hash_boundary:
            self._hash_new_full_blocks()

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, status={self.status.name}, prompt={self.num_prompt_tokens}, "
                f"output={len(self.output_token_ids)}, computed={self.num_computed_tokens})")
