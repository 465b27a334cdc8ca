"""The core's typed configuration: the cache and the scheduler.

Derived limits are computed in one place (``SchedulerConfig.effective_max_model_len``) so that the
scheduler never has to guess them. Invalid values raise ``ValueError`` naming the field and value.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.eviction_policies import check_eviction_policy
from engine.core.scheduling_policy import policy_rank


def _require(ok: bool, owner: str, name: str, value: object, requirement: str) -> None:
    if not ok:
        raise ValueError(f"{owner}.{name} must be {requirement}, got {value!r}")


@dataclass(slots=True)
class CacheConfig:
    block_size: int = 16
    num_gpu_blocks: int = 1024
    enable_prefix_caching: bool = True
    enable_kv_cache_events: bool = False
    # Blocks of the host-memory tier of the prefix cache (vLLM's KV offloading; engine/core/kv_offload.py),
    # 0: none. It is keyed by the prefix cache's block hashes, so it needs prefix caching.
    num_offload_blocks: int = 0
    # The window of the model's sliding-window layers (Mistral-7B-v0.1's 4096 on every layer; Gemma 3's 512 on
    # five layers of six), None: none slides. ``sliding_window_fraction`` is the share of layers that slide:
    # at 1 the KV-cache manager hands back the blocks that fall out of every request's window; below 1 the
    # full-attention layers still read every block, and the window only lowers what a step costs.
    sliding_window: int | None = None
    sliding_window_fraction: float = 1.0
    # Chunked local attention (Llama 4): a query in those layers reads only the keys of its own chunk of
    # ``attention_chunk_size`` tokens; ``attention_chunk_fraction`` is their share of the layers. SchedulerOutput
    # carries both to the cost model. With ``kv_cache_groups`` the chunked layers' groups (each spelled by the
    # chunk) hand back the blocks before their requests' current chunk; without, every block is kept. None: no
    # chunked layer.
    attention_chunk_size: int | None = None
    attention_chunk_fraction: float = 1.0
    # vLLM's hybrid KV-cache manager (engine/core/hybrid_kv_cache_manager.py): the window of each KV-cache group
    # (None: a full-attention group; with attention_chunk_size, the chunk of a chunked group), each group holding
    # an equal number of layers per block. None: one block table per request whose blocks hold every layer
    # (vLLM's --disable-hybrid-kv-cache-manager).
    kv_cache_groups: tuple[int | None, ...] | None = None
    # Which free cached block the prefix cache evicts first (engine/core/eviction_policies.py): vLLM's "lru",
    # "lfu", or "module:Class" naming a policy of your own.
    eviction_policy: str = "lru"

    def __post_init__(self) -> None:
        _require(isinstance(self.block_size, int) and self.block_size > 0, "cache", "block_size",
                 self.block_size, "a positive integer")
        _require(isinstance(self.num_gpu_blocks, int) and self.num_gpu_blocks >= 2, "cache", "num_gpu_blocks",
                 self.num_gpu_blocks, "an integer >= 2 (block 0 is reserved as the null block)")
        _require(isinstance(self.num_offload_blocks, int) and not isinstance(self.num_offload_blocks, bool)
                 and self.num_offload_blocks >= 0, "cache", "num_offload_blocks", self.num_offload_blocks,
                 "an integer >= 0")
        _require(self.num_offload_blocks == 0 or self.enable_prefix_caching, "cache", "num_offload_blocks",
                 self.num_offload_blocks, "0 without prefix caching (the host tier is keyed by its block hashes)")
        _require(self.sliding_window is None or (isinstance(self.sliding_window, int)
                                                 and not isinstance(self.sliding_window, bool) and self.sliding_window > 0),
                 "cache", "sliding_window", self.sliding_window, "a positive integer or None")
        _require(isinstance(self.sliding_window_fraction, (int, float)) and not isinstance(self.sliding_window_fraction, bool)
                 and 0 < self.sliding_window_fraction <= 1, "cache", "sliding_window_fraction",
                 self.sliding_window_fraction, "a share of the layers in (0, 1]")
        _require(self.attention_chunk_size is None or (isinstance(self.attention_chunk_size, int) and not isinstance(
            self.attention_chunk_size, bool) and self.attention_chunk_size > 0), "cache", "attention_chunk_size",
                 self.attention_chunk_size, "a positive integer or None")
        _require(isinstance(self.attention_chunk_fraction, (int, float))
                 and not isinstance(self.attention_chunk_fraction, bool) and 0 < self.attention_chunk_fraction <= 1,
                 "cache", "attention_chunk_fraction", self.attention_chunk_fraction, "a share of the layers in (0, 1]")
        _require(self.attention_chunk_size is None or self.sliding_window is None, "cache", "attention_chunk_size",
                 self.attention_chunk_size, "None with a sliding window (no model has both)")
        _require(not self.frees_out_of_window_blocks or self.num_offload_blocks == 0, "cache", "num_offload_blocks",
                 self.num_offload_blocks, "0 with a sliding window (KV offloading of sliding-window models is not "
                 "supported)")

        try:
            check_eviction_policy(self.eviction_policy)
        except ValueError as error:
            _require(False, "cache", "eviction_policy", self.eviction_policy, str(error))
        if isinstance(self.kv_cache_groups, list):  # as a run's summary.json records it
            self.kv_cache_groups = tuple(self.kv_cache_groups)
        groups = self.kv_cache_groups
        _require(groups is None or (isinstance(groups, tuple) and len(groups) >= 2 and all(
            window is None or (isinstance(window, int) and not isinstance(window, bool) and window > 0)
            for window in groups)), "cache", "kv_cache_groups", groups,
            "None, or a tuple of two or more windows (a positive integer, or None for full attention)")
        _require(groups is None or self.attention_chunk_size is None or all(
            span in (None, self.attention_chunk_size) for span in groups), "cache", "kv_cache_groups", groups,
            f"a chunked model's groups: None (full attention) or its attention_chunk_size {self.attention_chunk_size}")
        _require(groups is None or self.num_offload_blocks == 0, "cache", "num_offload_blocks", self.num_offload_blocks,
                 "0 with a hybrid KV cache (kv_cache_groups; KV offloading keeps one table per request)")

    @property
    def num_usable_blocks(self) -> int:
        return self.num_gpu_blocks - 1

    @property
    def frees_out_of_window_blocks(self) -> bool:
        """Every layer slides: a block out of a request's window is read by no layer again."""
        return self.sliding_window is not None and self.sliding_window_fraction == 1

    @property
    def capacity_tokens(self) -> int:
        """How many tokens of one request the whole pool can hold."""
        return self.num_usable_blocks * self.block_size


@dataclass(slots=True)
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 8192
    enable_chunked_prefill: bool = True
    # A prefill chunk of one request is cut at this many tokens per step (0: no cut), so that one
    # long prompt cannot take the whole budget from its peers. Only with chunked prefill: cutting is
    # chunking, and without it a prompt is prefilled in one step (vLLM applies the cut anyway, which
    # chunks the prompt that enable_chunked_prefill=False promised to keep whole).
    long_prefill_token_threshold: int = 0
    # fcfs, priority, shortest_prompt_first, shortest_output_first or "module:function" (scheduling_policy.py).
    policy: str = "fcfs"
    # vLLM's async scheduling: the next batch is scheduled while the last one runs, its decodes taking the
    # positions of tokens still being sampled (engine/core/batches_in_flight.py).
    async_scheduling: bool = False
    # Speculative decoding: up to this many draft tokens per decode, proposed by the executor and verified
    # in the next step (engine/core/spec_decode.py). 0: off.
    num_speculative_tokens: int = 0
    # KV slots held past each scheduled chunk (vLLM's num_lookahead_tokens): a proposer that runs a model (a draft
    # model) writes its KV for the token just sampled and for its drafts before the next step schedules them, so
    # it needs that many slots beyond the chunk. num_speculative_tokens with a draft model, else 0.
    num_lookahead_tokens: int = 0
    # Multi-LoRA serving: the running requests use at most this many distinct adapters (the runner's slots on
    # the device; engine/core/lora.py). 0: LoRA off, and a request naming an adapter is refused.
    max_loras: int = 0
    # Multimodal items (engine/core/encoder_cache_manager.py): the encoder tokens (image embeddings) one step may
    # compute, and the encoder outputs the runner keeps, in tokens; None: max_num_batched_tokens, as vLLM defaults
    # both (it then raises them to the model's largest item, which the simulator's setup does too).
    max_num_encoder_input_tokens: int | None = None
    encoder_cache_size: int | None = None
    # vLLM's disable_chunked_mm_input: a chunk never ends inside an item (the item's placeholders are prefilled in
    # one step; encoder_cache_manager.plan_encoder_inputs), so an item longer than the step's budget or the
    # long-prefill cut cannot be served.
    disable_chunked_mm_input: bool = False

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            value = getattr(self, name)
            _require(isinstance(value, int) and not isinstance(value, bool) and value >= 1, "scheduler", name,
                     value, "an integer >= 1")
        _require(isinstance(self.long_prefill_token_threshold, int) and self.long_prefill_token_threshold >= 0,
                 "scheduler", "long_prefill_token_threshold", self.long_prefill_token_threshold, "an integer >= 0")
        try:
            policy_rank(self.policy)
        except ValueError as error:
            _require(False, "scheduler", "policy", self.policy, str(error))
        _require(isinstance(self.async_scheduling, bool), "scheduler", "async_scheduling", self.async_scheduling,
                 "true or false")
        _require(isinstance(self.num_speculative_tokens, int) and not isinstance(self.num_speculative_tokens, bool)
                 and self.num_speculative_tokens >= 0, "scheduler", "num_speculative_tokens",
                 self.num_speculative_tokens, "an integer >= 0")
        _require(isinstance(self.max_loras, int) and not isinstance(self.max_loras, bool) and self.max_loras >= 0,
                 "scheduler", "max_loras", self.max_loras, "an integer >= 0")
        for name in ("max_num_encoder_input_tokens", "encoder_cache_size"):
            value = getattr(self, name)
            _require(value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1),
                     "scheduler", name, value, "None or an integer >= 1")
        _require(isinstance(self.disable_chunked_mm_input, bool), "scheduler", "disable_chunked_mm_input",
                 self.disable_chunked_mm_input, "true or false")
        _require(isinstance(self.num_lookahead_tokens, int) and not isinstance(self.num_lookahead_tokens, bool)
                 and 0 <= self.num_lookahead_tokens <= self.num_speculative_tokens, "scheduler",
                 "num_lookahead_tokens", self.num_lookahead_tokens,
                 f"an integer in [0, num_speculative_tokens={self.num_speculative_tokens}]")
        # A batch in flight would sample before its drafts were verified: the next batch could not know which
        # positions hold real tokens (vLLM added the combination later, with its own bookkeeping).
        _require(self.num_speculative_tokens == 0 or not self.async_scheduling, "scheduler", "num_speculative_tokens",
                 self.num_speculative_tokens, "0 with async_scheduling")

    @property
    def encoder_compute_budget(self) -> int:
        return self.max_num_encoder_input_tokens or self.max_num_batched_tokens

    @property
    def effective_encoder_cache_size(self) -> int:
        return self.encoder_cache_size or self.max_num_batched_tokens

    def effective_max_model_len(self, cache: CacheConfig) -> int:
        """The longest sequence (prompt + output) that can ever make progress.

        Bounded by the model, by the whole KV pool (a longer request could only preempt itself
        forever), and, without chunked prefill, by the per-step token budget (a longer prompt, or the
        recomputation of a preempted request, could never be scheduled in one step).
        """
        capacity = cache.capacity_tokens
        if cache.kv_cache_groups is not None:
            capacity = hybrid_capacity_tokens(cache, self.max_num_batched_tokens, self.num_speculative_tokens)
        limit = min(self.max_model_len, capacity)
        if not self.enable_chunked_prefill:
            limit = min(limit, self.max_num_batched_tokens)
        return limit


def hybrid_capacity_tokens(cache: CacheConfig, max_step_tokens: int, num_rollback_tokens: int) -> int:
    """The longest sequence whose blocks in every group of a hybrid KV cache fit the pool at once.

    A full group holds a block per ``block_size`` tokens. A windowed group of window W holds, at any step, the
    blocks from its first needed one to the end of the step's tokens: at most floor((W - 1 + step tokens +
    rollback) / block_size) + 2, and never more than the full groups' count (engine/core/kv_cache_manager.py).
    A chunked group of chunk C holds as many as a window of C (its first needed key, its earliest query's chunk
    start, lies at most C - 1 before that query).
    """
    block_size = cache.block_size
    windowed = [(window - 1 + max_step_tokens + num_rollback_tokens) // block_size + 2
                for window in cache.kv_cache_groups if window is not None]
    num_full = len(cache.kv_cache_groups) - len(windowed)

    def needed(num_blocks: int) -> int:
        return num_full * num_blocks + sum(min(num_blocks, bound) for bound in windowed)

    low, high = 0, cache.num_usable_blocks  # needed(low) fits; find the most blocks that fit
    while low < high:
        middle = (low + high + 1) // 2
        if needed(middle) <= cache.num_usable_blocks:
            low = middle
        else:
            high = middle - 1
    return low * block_size
