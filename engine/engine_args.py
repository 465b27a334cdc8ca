"""Everything a user can set about an engine, in one dataclass, mapped onto the typed config tree.

``EngineArgs`` is flat (it mirrors ``LLM``'s keyword arguments, like vLLM's); the configs it creates
are the ones each layer owns: ``RunnerConfig`` (engine/runner), ``SchedulerConfig`` and ``CacheConfig``
(engine/core). Values that depend on the loaded model (``max_model_len``, the number of KV blocks) are
resolved by the runner and passed in when the core's configs are created.
"""

from __future__ import annotations

import dataclasses

from dataclasses import dataclass
from pathlib import Path

from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.kv_cache_grouping import KVCacheGrouping, group_layers
from engine.core.pooling_params import PoolerConfig
from engine.models import default_model_path
from engine.runner.config import RunnerConfig
from engine.runner.lora.config import LoRAConfig
from engine.runner.spec_decode.config import SpeculativeConfig

# model=None means the generated "small" default; these names pick a generated default model.
DEFAULT_MODEL_NAMES = ("tiny", "small", "tiny-llava", "small-llava")
DEFAULT_MODEL = "small"
RUNNERS = ("generate", "pooling")


@dataclass
class EngineArgs:
    model: str | Path | None = None
    tokenizer: str | Path | None = None
    skip_tokenizer_init: bool = False
    dtype: str = "auto"
    device: str = "cpu"
    block_size: int = 16
    enable_prefix_caching: bool = True
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None
    num_gpu_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float = 0.9
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    attention_backend: str | None = None
    seed: int = 0
    scheduling_policy: str = "fcfs"
    # Which free cached block the prefix cache evicts first: lru (vLLM's), lfu, or module:Class
    # (engine/core/eviction_policies.py).
    prefix_cache_eviction_policy: str = "lru"
    enforce_eager: bool = False  # True: no CUDA graphs for decode steps
    # vLLM's --kv-offloading-size: GiB of host memory kept as a second tier of the prefix cache (0: none).
    kv_offloading_size_gib: float = 0.0
    # vLLM's --disable-hybrid-kv-cache-manager: a model mixing sliding-window and full layers (Gemma 2/3) keeps
    # every layer's KV for every token in one table instead of one table per group of layers
    # (engine/core/hybrid_kv_cache_manager.py). KV offloading turns the hybrid cache off, as vLLM's connectors do.
    disable_hybrid_kv_cache_manager: bool = False
    # vLLM's speculative_config: {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": ...,
    # "prompt_lookup_max": ...} or {"method": "draft_model", "model": PATH, "num_speculative_tokens": k} (a dict,
    # its JSON text, or a SpeculativeConfig); None: off.
    speculative_config: SpeculativeConfig | dict | str | None = None
    # Multi-LoRA serving (vLLM's names and defaults): requests may name a PEFT adapter (LoRARequest); at most
    # max_loras adapters run at once, each of rank <= max_lora_rank; max_cpu_loras loaded ones stay in host
    # memory (None: max_loras).
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    # vLLM's --runner: "generate" (text) or "pooling" (embeddings: LLM.embed, /v1/embeddings); an engine does
    # one or the other, as vLLM's. pooler_config (vLLM's --pooler-config): {"pooling_type": "LAST" | "MEAN" |
    # "CLS", "normalize": true}, a dict, its JSON text or a PoolerConfig; only with runner="pooling".
    runner: str = "generate"
    pooler_config: PoolerConfig | dict | str | None = None
    # Images (a vision-language checkpoint whose encoder the runner loads): the encoder tokens one step may compute
    # and the encoder outputs kept, in tokens (None: max_num_batched_tokens; either raised to one image, as vLLM
    # sizes them), and vLLM's --disable-chunked-mm-input (an image's placeholders in one chunk).
    max_num_encoder_input_tokens: int | None = None
    encoder_cache_size: int | None = None
    disable_chunked_mm_input: bool = False
    # vLLM's --reasoning-parser as the engine reads it: a reasoning model's structured outputs steer the answer
    # after its thought (engine/reasoning_parsers/), unless structured_outputs_in_reasoning (vLLM's
    # structured_outputs_config.enable_in_reasoning) has them steer the whole output.
    reasoning_parser: str | None = None
    structured_outputs_in_reasoning: bool = False

    def __post_init__(self) -> None:
        self.speculative_config = SpeculativeConfig.parse(self.speculative_config)
        if self.speculative_config is not None and self.speculative_config.method in ("draft_model", "eagle", "eagle3") \
                and self.kv_offloading_size_gib:
            # The host tier copies the target's KV only; a block loaded back would hold no draft KV.
            raise ValueError(f"speculative_config with method {self.speculative_config.method} (a proposer with a "
                             "KV cache of its own) does not run with kv_offloading_size_gib > 0")
        if not isinstance(self.enable_lora, bool):
            raise ValueError(f"enable_lora must be True or False, got {self.enable_lora!r}")
        self.check_runner()
        if self.reasoning_parser is not None:
            from engine.reasoning_parsers import get_parser

            get_parser(self.reasoning_parser)  # a ValueError listing the known names

    def check_runner(self) -> None:
        """The runner and its pooler config, or a ValueError naming the field; pooling_config is resolved."""
        if self.runner not in RUNNERS:
            raise ValueError(f"runner must be one of {list(RUNNERS)}, got {self.runner!r}")
        if self.runner != "pooling":
            if self.pooler_config is not None:
                raise ValueError("pooler_config needs runner='pooling' (an engine that embeds)")
            return
        self.pooler_config = PoolerConfig.parse(self.pooler_config)
        # Refused rather than half-done: drafts and adapters would run for requests that never decode.
        if self.speculative_config is not None:
            raise ValueError("runner='pooling' does not take speculative_config: embedding requests decode nothing")
        if self.enable_lora:
            raise ValueError("runner='pooling' does not take enable_lora: embeddings with LoRA adapters are not "
                             "supported")

    @property
    def is_pooling(self) -> bool:
        return self.runner == "pooling"

    def create_lora_config(self) -> LoRAConfig | None:
        """The runner's LoRA settings (a ValueError naming a bad one), or None without enable_lora."""
        if not self.enable_lora:
            return None
        return LoRAConfig(max_loras=self.max_loras, max_lora_rank=self.max_lora_rank,
                          max_cpu_loras=self.max_cpu_loras)

    def resolve_model_path(self) -> Path:
        """The checkpoint folder: a generated default model by name, or a local folder."""
        model = DEFAULT_MODEL if self.model is None else self.model
        if isinstance(model, str) and model in DEFAULT_MODEL_NAMES:
            return default_model_path(model)
        path = Path(model)
        if not (path / "config.json").is_file():
            raise ValueError(f"model must be one of {DEFAULT_MODEL_NAMES} or a local checkpoint folder with a "
                             f"config.json, got {str(model)!r}")
        return path

    def resolve_tokenizer_path(self, model_path: Path) -> Path | None:
        if self.skip_tokenizer_init:
            return None
        if self.tokenizer is None:
            return model_path
        if isinstance(self.tokenizer, str) and self.tokenizer in DEFAULT_MODEL_NAMES:
            return default_model_path(self.tokenizer)
        return Path(self.tokenizer)

    def create_runner_config(self, model_path: Path) -> RunnerConfig:
        return RunnerConfig(
            model=model_path, dtype=self.dtype, device=self.device, attention_backend=self.attention_backend,
            block_size=self.block_size, max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens, max_model_len=self.max_model_len,
            num_gpu_blocks=self.num_gpu_blocks, kv_cache_memory_bytes=self.kv_cache_memory_bytes,
            gpu_memory_utilization=self.gpu_memory_utilization, seed=self.seed, enforce_eager=self.enforce_eager,
            speculative_config=self.resolved_speculative_config(), lora_config=self.create_lora_config(),
            pooling=self.is_pooling)

    def resolved_speculative_config(self) -> SpeculativeConfig | None:
        """The speculative config with its draft model's folder found (a generated default by name)."""
        speculative = self.speculative_config
        if speculative is None or speculative.model is None:
            return speculative
        if speculative.model in DEFAULT_MODEL_NAMES:
            return dataclasses.replace(speculative, model=str(default_model_path(speculative.model)))
        if not (Path(speculative.model) / "config.json").is_file():
            raise ValueError(f"speculative_config.model must be one of {DEFAULT_MODEL_NAMES} or a local checkpoint "
                             f"folder with a config.json, got {speculative.model!r}")
        return speculative

    def create_scheduler_config(self, max_model_len: int, tokens_per_image: int = 0,
                                images_whole: bool = False) -> SchedulerConfig:
        """``tokens_per_image``: a vision-language model's placeholders per image (0: text only); a step's encoder
        budget and the runner's encoder cache hold at least one image, as vLLM sizes them. ``images_whole``: the
        model's image tokens attend each other both ways (Gemma 3), so each image is prefilled in one chunk
        (disable_chunked_mm_input, as vLLM sets it for such models)."""
        def encoder_tokens(configured: int | None) -> int | None:
            return max(configured or self.max_num_batched_tokens, tokens_per_image) if tokens_per_image else configured
        return SchedulerConfig(
            max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=max_model_len, enable_chunked_prefill=self.enable_chunked_prefill,
            long_prefill_token_threshold=self.long_prefill_token_threshold, policy=self.scheduling_policy,
            num_speculative_tokens=self.speculative_config.num_speculative_tokens
            if self.speculative_config is not None else 0,
            num_lookahead_tokens=self.speculative_config.num_lookahead_tokens
            if self.speculative_config is not None else 0,
            max_loras=self.max_loras if self.enable_lora else 0,
            max_num_encoder_input_tokens=encoder_tokens(self.max_num_encoder_input_tokens),
            encoder_cache_size=encoder_tokens(self.encoder_cache_size),
            disable_chunked_mm_input=self.disable_chunked_mm_input or images_whole)

    def check_kv_offloading(self) -> None:
        """A ValueError naming kv_offloading_size_gib when it cannot be honoured."""
        size = self.kv_offloading_size_gib
        if isinstance(size, bool) or not isinstance(size, (int, float)) or not 0 <= size < float("inf"):
            raise ValueError(f"kv_offloading_size_gib must be a number of GiB >= 0, got {size!r}")
        if size and not self.enable_prefix_caching:
            raise ValueError(f"kv_offloading_size_gib={size!r} needs enable_prefix_caching=True (the host tier is "
                             "keyed by the prefix cache's block hashes)")

    def kv_cache_grouping(self, layer_kv_spans) -> KVCacheGrouping | None:
        """The hybrid KV cache's groups for a model whose layers attend these windows or chunks
        (ModelConfig.layer_kv_spans; None: one table)."""
        if self.disable_hybrid_kv_cache_manager or self.kv_offloading_size_gib:
            return None
        return group_layers(layer_kv_spans)

    def create_cache_config(self, num_gpu_blocks: int, num_offload_blocks: int = 0,
                            sliding_window: int | None = None, sliding_window_fraction: float = 1.0,
                            grouping: KVCacheGrouping | None = None,
                            attention_chunk: tuple[int | None, float] = (None, 1.0)) -> CacheConfig:
        """``sliding_window``: the window of the model's sliding layers, ``sliding_window_fraction`` their share
        (ModelConfig.sliding_window_fraction); ``grouping``: the hybrid KV cache's (``kv_cache_grouping``);
        ``attention_chunk``: chunked local attention's chunk and share of the layers (ModelConfig.attention_chunk)."""
        if sliding_window is not None and sliding_window_fraction == 1 and num_offload_blocks:
            raise ValueError(f"kv_offloading_size_gib={self.kv_offloading_size_gib!r} is not supported for a model whose "
                             f"every layer attends a sliding window (sliding_window={sliding_window}); set "
                             "kv_offloading_size_gib=0")
        return CacheConfig(block_size=self.block_size, num_gpu_blocks=num_gpu_blocks,
                           enable_prefix_caching=self.enable_prefix_caching, num_offload_blocks=num_offload_blocks,
                           sliding_window=sliding_window, sliding_window_fraction=sliding_window_fraction,
                           attention_chunk_size=attention_chunk[0], attention_chunk_fraction=attention_chunk[1],
                           kv_cache_groups=None if grouping is None else grouping.windows,
                           eviction_policy=self.prefix_cache_eviction_policy)
