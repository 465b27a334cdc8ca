"""The small sections of a workload file: engine limits, SLOs, shared prefixes, priorities, the trace.

Field names follow vLLM's engine arguments (``max_num_seqs``, ``max_num_batched_tokens``,
``enable_chunked_prefill``, ...) so that a vLLM user can read a workload file without a glossary.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)

from workloads.errors import problems_error
from workloads.popularity import parse_popularity
from workloads.lora_section import LORA_RANKS
from workloads.schema_base import SchemaModel
from workloads.speculative_decoding_section import SpeculativeDecodingSection
from workloads.traces import TraceFormat, TraceFormatError, TraceRecords, infer_format, read_trace

# The engine's named scheduling policies (engine/core/scheduling_policy.py; a test keeps the two lists equal),
# and the form of a user's own rank function.
SCHEDULING_POLICIES = ("fcfs", "priority", "shortest_prompt_first", "shortest_output_first")
_RANK_FUNCTION = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")

MAX_BLOCK_SIZE = 256


class EngineSection(SchemaModel):
    """The engine's cache and scheduler limits (vLLM's names and defaults)."""

    block_size: int = 16
    # None: derived by the executor from gpu_memory_utilization and the model's size.
    num_gpu_blocks: int | None = Field(default=None, ge=2)
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    max_num_seqs: PositiveInt = 256
    max_num_batched_tokens: PositiveInt = 8192
    # None: the model's own context length.
    max_model_len: PositiveInt | None = None
    enable_chunked_prefill: bool = True
    # A prefill chunk is cut at this many tokens per step (0: no cut), so one long prompt cannot take
    # the whole step budget from its peers.
    long_prefill_token_threshold: NonNegativeInt = 0
    enable_prefix_caching: bool = True
    # A model mixing sliding-window and full layers (Gemma 2/3) gets vLLM's hybrid KV cache (simulated: one block
    # table per group of layers, the windowed groups handing back blocks; sim/kv_cache_groups.py); true keeps
    # every layer's KV for every token, as vLLM's --disable-hybrid-kv-cache-manager (and this engine's real runs).
    disable_hybrid_kv_cache_manager: bool = False
    # vLLM's fcfs or priority; shortest_prompt_first, shortest_output_first, or your own rank function as
    # "module:function" (engine/core/scheduling_policy.py says what each does; the engine imports the function).
    scheduling_policy: str = "fcfs"
    # Which free cached block the prefix cache evicts first: lru (vLLM's), lfu, or "module:Class" naming a policy
    # of your own (engine/core/eviction_policies.py says what each does).
    prefix_cache_eviction_policy: str = "lru"
    # GPUs one engine shards the model over (simulated; the model must split evenly: sim/model_shapes.py).
    tensor_parallel_size: PositiveInt = 1
    # Pipeline stages one engine splits the model's layers over, each on tensor_parallel_size GPUs
    # (simulated): up to this many batches are in flight, as vLLM's batch queue keeps them.
    pipeline_parallel_size: PositiveInt = 1
    # Data-parallel ranks (simulated; vLLM's --data-parallel-size): each rank its own scheduler and KV cache on
    # tensor_parallel_size GPUs, the cluster's router giving each request to one. A mixture of experts' routed
    # experts are spread over all ranks' GPUs (--enable-expert-parallel) and its ranks step in lockstep
    # (sim/data_parallel_loop.py); a dense model's ranks are independent replicas.
    data_parallel_size: int = Field(default=1, ge=1, le=256)
    # How often a mixture of experts' router picks each expert (simulated; sim/expert_popularity.py): uniform, or
    # {zipf: s} over the experts in a random order. A property of the model on this traffic, not of vLLM.
    expert_popularity: Literal["uniform"] | dict[str, float] = "uniform"
    # vLLM's expert-parallel load balancer (--enable-eplb, simulated): with data-parallel ranks, hot experts are
    # replicated and moved until every GPU has the same share of the rows.
    enable_eplb: bool = False
    # vLLM's async scheduling (simulated): the engine schedules the next step while the GPU runs this one,
    # so its own overhead hides behind the GPU's time. vLLM turns it on by default; this engine's real runner
    # runs one step at a time, so it is off here unless asked for.
    async_scheduling: bool = False
    # The KV cache's element type (simulated): auto is the model's dtype; an fp8 cache holds twice the
    # tokens in the same memory and halves the bytes attention reads.
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = "auto"
    # Weight quantization (simulated; sim/weight_quantization.py): fp8, the layers' projections and experts in
    # one byte at the fp8 tensor-core rate where the hardware has one; mxfp4, a mixture of experts' routed
    # experts in 4.25 bits, weight-only; w4a16 / w8a16, every projection in 4.125 or 8 bits, weight-only. null: the
    # model's dtype.
    quantization: Literal["fp8", "mxfp4", "w4a16", "w8a16"] | None = None
    # vLLM's KV offloading (--kv-offloading-size, simulated): GiB of host memory that keeps computed KV blocks
    # as a second tier of the prefix cache; a prefix the GPU's cache lost is loaded from there over the host
    # link instead of recomputed (sim/kv_offload_loads.py). 0: off. Needs prefix caching.
    kv_offloading_size_gib: float = Field(default=0.0, ge=0, le=1e6)
    # vLLM's speculative decoding (simulated): each decode carries draft tokens, verified in one pass; the
    # accepted ones and one more come out of the step (workloads/speculative_decoding_section.py). null: off.
    speculative_decoding: SpeculativeDecodingSection | None = None
    # vLLM's multi-LoRA serving (simulated; workload.lora picks each request's adapter): adapters on the device
    # at once (0: LoRA off), the rank their slots are sized for (a smaller adapter is padded to it), and
    # adapters kept in host memory (null: max_loras), whose load is a copy over the host link, not a disk read.
    max_loras: NonNegativeInt = 0
    max_lora_rank: int = 16
    max_cpu_loras: PositiveInt | None = None
    # Multimodal requests (workload.images; engine/core/encoder_cache_manager.py): the encoder tokens (image
    # embeddings) one step may compute and the encoder outputs kept between steps, in tokens (null: vLLM's
    # default, max_num_batched_tokens raised to the largest image), and vLLM's disable_chunked_mm_input (an
    # image's placeholders are prefilled in one step, never split across chunks).
    max_num_encoder_input_tokens: PositiveInt | None = None
    encoder_cache_size: PositiveInt | None = None
    disable_chunked_mm_input: bool = False

    @field_validator("expert_popularity", mode="before")
    @classmethod
    def _expert_popularity(cls, value):
        return parse_popularity(value, ("uniform",), "expert i picked")

    @field_validator("scheduling_policy")
    @classmethod
    def _policy_is_named_or_a_function(cls, value: str) -> str:
        if value not in SCHEDULING_POLICIES and not _RANK_FUNCTION.fullmatch(value):
            raise ValueError(f"must be one of {', '.join(SCHEDULING_POLICIES)}, or 'module:function' naming a rank "
                             "function (lower is served first)")
        return value

    @field_validator("prefix_cache_eviction_policy")
    @classmethod
    def _eviction_policy_is_named_or_a_class(cls, value: str) -> str:
        # The class is imported and checked when the engine is built (engine/core/eviction_policies.py).
        if value not in ("lru", "lfu") and not _RANK_FUNCTION.fullmatch(value):
            raise ValueError("must be lru, lfu, or 'module:Class' naming an eviction policy")
        return value

    @field_validator("max_lora_rank")
    @classmethod
    def _lora_rank_is_vllms(cls, value: int) -> int:
        if value not in LORA_RANKS:
            raise ValueError(f"must be one of vLLM's ranks {', '.join(map(str, LORA_RANKS))}")
        return value

    @model_validator(mode="after")
    def _cpu_loras_hold_the_device_ones(self) -> EngineSection:
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise problems_error([("max_cpu_loras", f"must be >= max_loras ({self.max_loras}): the host cache holds "
                                   "every adapter on the device", self.max_cpu_loras)])
        return self

    def cpu_lora_capacity(self) -> int:
        """Adapters the host cache holds: max_cpu_loras, or max_loras when it is null (vLLM's default)."""
        return self.max_loras if self.max_cpu_loras is None else self.max_cpu_loras

    @field_validator("block_size")
    @classmethod
    def _block_size_is_power_of_two(cls, value: int) -> int:
        # Block tables index tokens with shifts and masks; a power of two keeps that exact.
        if value < 1 or value & (value - 1):
            raise ValueError("must be a positive power of two")
        if value > MAX_BLOCK_SIZE:
            raise ValueError(f"must be at most {MAX_BLOCK_SIZE}")
        return value

    @model_validator(mode="after")
    def _offloading_needs_prefix_caching(self) -> EngineSection:
        if self.kv_offloading_size_gib > 0 and not self.enable_prefix_caching:
            raise problems_error([("kv_offloading_size_gib", "needs enable_prefix_caching: true (the host tier is "
                                   "keyed by the prefix cache's block hashes)", self.kv_offloading_size_gib)])
        return self

    @model_validator(mode="after")
    def _unchunked_budget_fits_a_whole_prompt(self) -> EngineSection:
        unchunked = not self.enable_chunked_prefill and self.max_model_len is not None
        if unchunked and self.max_num_batched_tokens < self.max_model_len:
            raise problems_error(
                [
                    (
                        "max_num_batched_tokens",
                        f"must be >= max_model_len ({self.max_model_len}) when enable_chunked_prefill is false, "
                        "or a long prompt could never be scheduled in one step",
                        self.max_num_batched_tokens,
                    )
                ]
            )
        return self


class SLOSection(SchemaModel):
    """Latency targets in milliseconds; a request meeting all that are set counts toward goodput."""

    ttft_ms: PositiveFloat | None = None
    tpot_ms: PositiveFloat | None = None
    e2e_ms: PositiveFloat | None = None

    def thresholds(self) -> dict[str, float]:
        """Only the targets that are set, in the shape analysis.metrics takes."""
        return {key: value for key, value in self.model_dump().items() if value is not None}


class SharedPrefixSection(SchemaModel):
    """``fraction`` of requests start with one of ``num_groups`` fixed prefixes of ``prefix_len`` tokens.

    Models a shared system prompt or few-shot header: every request of a group has identical leading
    tokens, so the prefix cache can reuse their KV blocks. The sampled prompt length is the total
    prompt length, raised to at least ``prefix_len + 1`` so each request has a token of its own.
    """

    num_groups: PositiveInt
    prefix_len: PositiveInt
    fraction: float = Field(default=1.0, ge=0, le=1)


class PrioritySection(SchemaModel):
    """Each request draws a priority from ``levels`` with ``weights`` (uniform when absent).

    As in vLLM, a lower value is served first under ``scheduling_policy: priority``. Under ``fcfs`` the
    priorities are still drawn (and ignored by the scheduler), so a sweep over the policy compares the
    very same requests.
    """

    levels: list[int] = Field(min_length=1)
    weights: list[NonNegativeFloat] | None = None

    @model_validator(mode="after")
    def _weights_match_levels(self) -> PrioritySection:
        problems = []
        if len(set(self.levels)) != len(self.levels):
            problems.append(("levels", "must not repeat a level", self.levels))
        if self.weights is not None:
            if len(self.weights) != len(self.levels):
                problems.append(("weights", f"needs one entry per level ({len(self.levels)})", self.weights))
            elif sum(self.weights) <= 0:
                problems.append(("weights", "must not all be zero", self.weights))
        if problems:
            raise problems_error(problems)
        return self

    def probabilities(self) -> np.ndarray:
        weights = np.ones(len(self.levels)) if self.weights is None else np.asarray(self.weights, dtype=np.float64)
        return weights / weights.sum()


class TraceSection(SchemaModel):
    """A request trace to replay times and/or lengths from (see traces.py for the formats).

    - ``path``: the file; relative paths in a YAML file are resolved against the YAML's directory.
    - ``format``: ``csv`` or ``mooncake``; inferred from the suffix (.csv / .jsonl) when absent.
    - ``time_scale``: multiplies the trace's inter-arrival times (0.5 replays it twice as fast).
    - ``sample``: ``sequential`` takes rows in file order; ``random_with_replacement`` draws rows at
      random, for more requests than the trace holds (arrivals must then be synthetic).
    - ``start_offset``: rows to skip first; ``num_rows``: use only this many rows after them.
    """

    path: str = Field(min_length=1)
    format: TraceFormat | None = None
    time_scale: PositiveFloat = 1.0
    sample: Literal["sequential", "random_with_replacement"] = "sequential"
    start_offset: NonNegativeInt = 0
    num_rows: PositiveInt | None = None

    @field_validator("path")
    @classmethod
    def _file_exists(cls, value: str) -> str:
        if not Path(value).expanduser().is_file():
            raise ValueError("trace file not found")
        return value

    @model_validator(mode="after")
    def _trace_is_readable(self) -> TraceSection:
        try:
            records = self.records()
        except TraceFormatError as error:
            raise problems_error([("path", f"cannot read the trace: {error}", self.path)]) from None
        if self.start_offset >= records.num_rows:
            raise problems_error(
                [("start_offset", f"must be < the trace's {records.num_rows} rows", self.start_offset)]
            )
        return self

    def resolved_format(self) -> TraceFormat:
        return self.format or infer_format(self.path)

    def records(self) -> TraceRecords:
        return read_trace(self.path, self.resolved_format())

    def pool_rows(self) -> np.ndarray:
        """Indices of the rows this workload may use: from start_offset, at most num_rows of them."""
        end = self.records().num_rows
        if self.num_rows is not None:
            end = min(end, self.start_offset + self.num_rows)
        return np.arange(self.start_offset, end)
