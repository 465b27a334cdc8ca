"""What the scheduler hands the executor each step (the seed's section 4.4).

New requests carry everything the runner must cache about them; requests the runner already knows
carry only what changed (new block ids, and their computed-token count before this step). All
``num_computed_tokens`` values here are as they were *before* this step's tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.lora import LoRARequest
from engine.core.multimodal import MultiModalFeature
from engine.core.pooling_params import PoolingParams
from engine.core.sampling_params import SamplingParams


@dataclass(slots=True)
class NewRequestData:
    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    # With a hybrid KV cache (CacheConfig.kv_cache_groups), a tuple of one list per group, here and in
    # CachedRequestData.new_block_ids.
    block_ids: list[int]
    num_computed_tokens: int
    eos_token_id: int | None = None
    # The adapter its tokens run with (None: the base model); the runner keeps it for the request's life.
    lora_request: LoRARequest | None = None
    # An embedding request's pooling (None: a generation request); engine/core/pooling_params.py.
    pooling_params: PoolingParams | None = None
    # Its multimodal items (engine/core/multimodal.py), which scheduled_encoder_inputs names by index.
    mm_features: tuple[MultiModalFeature, ...] = ()


@dataclass(slots=True)
class CachedRequestData:
    """Parallel lists, one entry per running request the runner has seen before."""
    req_ids: list[str] = field(default_factory=list)
    # True for a request resumed after preemption: its block table is replaced by new_block_ids and
    # resumed_token_ids holds all its tokens (prompt + outputs so far) to recompute.
    resumed_from_preemption: list[bool] = field(default_factory=list)
    new_block_ids: list[list[int] | None] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)
    num_output_tokens: list[int] = field(default_factory=list)
    resumed_token_ids: dict[str, list[int]] = field(default_factory=dict)

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)


@dataclass(slots=True)
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    # Tokens computed this step per request id; a decode schedules 1.
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    # Leading blocks shared by every running request (for cascade attention).
    num_common_prefix_blocks: int
    # Requests finished or aborted since the previous step: the runner drops their state.
    finished_req_ids: set[str]
    # Requests preempted in this step: the runner drops them from its batch (they resume later).
    preempted_req_ids: set[str]
    # Blocks allocated since the previous step; the runner zeroes them before use.
    new_block_ids_to_zero: list[int]
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    # Prefix-cache tokens queried / hit by requests admitted in this step (true hits only).
    num_prefix_query_tokens: int = 0
    num_prefix_hit_tokens: int = 0
    # Block-table entries pointing at a block another live request holds too, times the block size:
    # KV tokens a batch reads more than once (shared prefixes), as of this schedule.
    num_shared_kv_tokens: int = 0
    # Runs of consecutive physical block ids over every live request's block table, as of this
    # schedule (KVCacheManager.num_block_runs): how scattered the KV a step gathers lies.
    num_kv_block_runs: int = 0
    # The window of the model's sliding-window layers and their share of the layers (CacheConfig): a query
    # reads at most this many keys in those layers, which is what a step costs; None: the whole context.
    sliding_window: int | None = None
    sliding_window_fraction: float = 1.0
    # Chunked local attention's chunk and its share of the layers (CacheConfig): a query there reads the keys of
    # its own chunk only. None: no chunked layer.
    attention_chunk_size: int | None = None
    attention_chunk_fraction: float = 1.0
    # Remote prefills whose KV load this step starts (request id -> tokens to load; engine/core/kv_transfer.py).
    kv_loads: dict[str, int] = field(default_factory=dict)
    # With a host tier of the prefix cache (engine/core/kv_offload.py): each scheduled request's computed tokens
    # once this batch is done; when it is back, the full blocks up to there are copied to the host.
    offload_computed_tokens: dict[str, int] = field(default_factory=dict)
    # The host tier's copies for the executor, in this order at the start of the step: (GPU block id, host slot)
    # to the host, before any block is zeroed or written; then per request whose load starts, (host slot, GPU
    # block id) back, after the zeroing. The executor reports each load done (ModelRunnerOutput.finished_kv_loads).
    offload_stores: list[tuple[int, int]] = field(default_factory=list)
    offload_loads: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    # Requests whose chunk ends before their known tokens: they sample nothing this step. Fixed when the
    # batch is scheduled, because a later batch may advance the request before this one is back.
    partial_prefill_req_ids: set[str] = field(default_factory=set)
    # The batch's place in the scheduler's order (engine/core/batches_in_flight.py).
    batch_index: int = 0
    # Multimodal items (engine/core/encoder_cache_manager.py): per request id, the indices of its items whose
    # encoder output the runner computes in this step (and keeps), and their encoder tokens in all; the
    # identifiers whose kept outputs the runner drops, before it computes this step's.
    scheduled_encoder_inputs: dict[str, list[int]] = field(default_factory=dict)
    num_encoder_tokens: int = 0
    # Each of those items' encoder tokens, in the order above (what a cost model needs of them).
    encoder_input_lengths: list[int] = field(default_factory=list)
    free_encoder_mm_hashes: list[str] = field(default_factory=list)

    @property
    def num_scheduled_reqs(self) -> int:
        return len(self.num_scheduled_tokens)

    @property
    def is_empty(self) -> bool:
        return self.total_num_scheduled_tokens == 0
