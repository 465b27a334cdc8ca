"""The model runner: SchedulerOutput in, sampled tokens out (the seed's 5.1 and 7).

One ``execute_model`` call:
1. ``_update_states``: drop finished and preempted requests, zero newly allocated blocks, add new and
   resumed requests, extend block tables, take unscheduled requests out of the batch, condense.
2. ``prepare_inputs``: flat input_ids / positions / slot_mapping / query_start_loc / seq_lens, in numpy.
3. The backend's metadata builder, then the model forward over every scheduled token.
4. Logits only for the last token of each row that reaches its last known token, then the sampler.

The scheduler is the source of truth for how many tokens of a request are computed: the runner takes
``num_computed_tokens`` from every SchedulerOutput rather than advancing its own count, so the two
can never drift apart (e.g. after a preemption, or a request that sat out a step).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import torch

from engine.core.kv_cache_grouping import KVCacheGrouping
from engine.core.outputs import ModelRunnerOutput
from engine.core.scheduler_output import SchedulerOutput
from engine.models import load_model
from engine.models.config import ModelConfig
from engine.models.loader import resolve_dtype
from engine.models.registry import get_model_class
from engine.models.vision import load_image_encoder
from engine.runner.attention import allocate_kv_caches
from engine.runner.attention.kv_cache import allocate_grouped_kv_caches, kv_cache_bytes_per_block
from engine.runner.host_kv_cache import HostKVCache
from engine.runner.attention_builders import get_metadata_builder
from engine.runner.config import RunnerConfig, resolve_attention_backend, resolve_device, resolve_runtime_dtype
from engine.runner.decode_graphs import DecodeGraphs, cuda_graphs_unavailable_reason
from engine.runner.eager_shapes import pad_step_inputs, resolve_token_padding, warm_up_shapes
from engine.runner.encoder_outputs import EncoderOutputs, bidirectional_spans, deepstack_inputs, fill_placeholders
from engine.runner.mrope_positions import as_plain_positions, batch_mrope_positions, padded_columns, use_mrope
from engine.runner.input_batch import InputBatch
from engine.runner.kv_cache_sizing import determine_num_gpu_blocks
from engine.runner.logprobs_lists import split_logprobs
from engine.runner.lora.manager import LoRAManager
from engine.runner.prepare_inputs import prepare_inputs
from engine.runner.pooler import PoolingCollector, any_pooling, give_placeholder_tokens
from engine.runner.prompt_logprobs import PromptLogprobsCollector, any_prompt_logprobs
from engine.runner.request_state import CachedRequestState
from engine.runner.sampler import Sampler
from engine.runner.sampling_batch import SamplingMetadataCache
from engine.runner.spec_decode.draft_model import DraftModelProposer
from engine.runner.spec_decode.eagle import Eagle3Proposer, EagleProposer
from engine.runner.spec_decode.runner_step import SpeculativeStep
from engine.runner.state_updates import update_states
from engine.runner.step_metadata import step_attention_metadata
from engine.runner.structured_output import StructuredOutputs
from engine.runner.structured_output.logits_mask import apply_grammar_masks, constrained_rows

logger = logging.getLogger(__name__)


class ModelRunner:
    def __init__(self, config: RunnerConfig, tokenizer=None) -> None:
        self.config = config
        self.device = resolve_device(config.device)
        model_config = ModelConfig.from_pretrained(config.model)
        model_class = get_model_class(model_config)
        self.attention_backend = resolve_attention_backend(config.attention_backend, self.device,
                                                           model_class.unsupported_attention_backends)
        self.dtype = resolve_runtime_dtype(config.dtype, resolve_dtype(config.dtype, model_config),
                                           self.attention_backend)
        self.model, self.model_config = load_model(config.model, self.dtype, self.device,
                                                   attention_backend=self.attention_backend,
                                                   lm_head_optional=config.pooling)
        # A vision-language checkpoint's image encoder and its kept outputs (encoder_outputs.py); None: text only.
        image_encoder = load_image_encoder(config.model, self.dtype, self.device)
        if image_encoder is not None and image_encoder.bidirectional_image_attention \
                and not self.model.attention_backend.supports_bidirectional_spans:
            # Gemma 3's image tokens attend each other both ways; the torch and triton backends take such spans.
            logger.warning("%s images need attention_backend 'torch' or 'triton' (their tokens attend each other both "
                           "ways, which the %s kernels do not); images are refused, text is served",
                           image_encoder.family, self.model.attention_backend.name)
            image_encoder = None
        if image_encoder is not None:  # Mistral 3's spans hold the language model's own row marks
            image_encoder.attach_language_model(self.model, tokenizer, config.model)
        self.encoder_outputs = EncoderOutputs(image_encoder, self.device) \
            if image_encoder is not None else None
        # Qwen2-VL: the language model turns image tokens by three positions (mrope_positions.py); None: one.
        self.mrope_merge_size = use_mrope(self.model, image_encoder)
        # Multi-LoRA serving: the model's projections get adapter slots (engine/runner/lora/); None: off.
        self.lora = LoRAManager(self.model, config.lora_config, self.device) \
            if config.lora_config is not None else None
        limit = self.model.max_model_len_limit
        if config.max_model_len is not None and config.max_model_len > limit:
            raise ValueError(f"max_model_len {config.max_model_len} exceeds what model {str(config.model)!r} "
                             f"supports ({limit})")
        self.max_model_len = config.max_model_len or limit
        self.model.fit_context(self.max_model_len)
        # Llama 4's chunked layers attend per-chunk virtual requests, whose block tables start at a chunk's first
        # block (engine/runner/attention/local_attention.py).
        self.attention_chunk_size = getattr(self.model, "attention_chunk_size", None)
        if self.attention_chunk_size and self.attention_chunk_size % config.block_size:
            raise ValueError(f"block_size {config.block_size} must divide the model's attention_chunk_size "
                             f"{self.attention_chunk_size}")
        self.block_size = config.block_size
        self.max_num_reqs = config.max_num_seqs
        self.vocab_size = self.model_config.vocab_size
        # Only for SamplingParams.bad_words, which arrive as text.
        self.tokenizer = tokenizer
        # Grammars for SamplingParams.structured_outputs; build_engine sets it, with the engine's EOS ids and the
        # tokenizer the front end checks requests with. A runner without one refuses structured requests.
        self.structured_outputs: StructuredOutputs | None = None
        # The requests with a grammar: while empty, a step neither looks for grammars nor allocates a bitmask.
        self.grammar_req_ids: set[str] = set()
        # Unseeded random sampling draws from torch's global generator: seed it once per engine.
        torch.manual_seed(config.seed)

        self.requests: dict[str, CachedRequestState] = {}
        self.input_batch = InputBatch(self.max_num_reqs, self.max_model_len,
                                      -(-self.max_model_len // self.block_size), self.block_size)
        self.metadata_builder = get_metadata_builder(self.attention_backend, self.device)
        self.sampler = Sampler()
        self.sampling_metadata_cache = SamplingMetadataCache(self.vocab_size, self.device)
        self.prompt_logprobs = PromptLogprobsCollector()
        # Embedding requests' hidden states, across prefill chunks; a classifier's score head turns each into its
        # labels' probabilities (engine/models/sequence_classification.py).
        self.pooling = PoolingCollector(getattr(self.model, "classify", None))
        # Speculative decoding (engine/runner/spec_decode/): drafts proposed after each step, verified in the next.
        self.speculative = SpeculativeStep(config.speculative_config, self.vocab_size, self._draft_model()) \
            if config.speculative_config is not None else None
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.num_gpu_blocks = 0
        # vLLM's hybrid KV cache, when initialize_kv_cache was given one (engine/core/kv_cache_grouping.py).
        self.kv_cache_grouping: KVCacheGrouping | None = None
        # KV offloading's cache in host memory (engine/runner/host_kv_cache.py), when the engine has one.
        self.host_kv_cache: HostKVCache | None = None
        # Decode-only steps replay captured CUDA graphs when this is set (see decode_graphs.py).
        self.decode_graphs: DecodeGraphs | None = None
        # An EAGLE-3 head reads the target's intermediate layers, which a captured graph does not hand out.
        eagle3 = config.speculative_config is not None and config.speculative_config.method == "eagle3"
        self.cuda_graphs_off_reason = cuda_graphs_unavailable_reason(
            self.device, self.attention_backend, config.enforce_eager,
            "an EAGLE-3 head reads the target's intermediate layers" if eagle3 else self.model.cuda_graph_unsafe_reason)
        self.eager_token_padding = resolve_token_padding(config.eager_token_padding, self.device)
        # Wall time of the last execute_model, including the device sync that reads the samples back.
        self.last_step_duration_s = 0.0
        self.num_steps = 0

    def _draft_model(self) -> DraftModelProposer | None:
        """The proposer with a network of its own: a draft model, or an EAGLE head (a DraftModelProposer that reads
        the target's features); None for n-gram drafts."""
        speculative = self.config.speculative_config
        if speculative.method == "ngram":
            return None
        options = dict(dtype=self.dtype, device=self.device, attention_backend=self.attention_backend,
                       target_config=self.model_config, max_model_len=self.max_model_len)
        if speculative.method in ("eagle", "eagle3"):
            proposer = EagleProposer if speculative.method == "eagle" else Eagle3Proposer
            return proposer(speculative.model, speculative.num_speculative_tokens, target_model=self.model, **options)
        return DraftModelProposer(speculative.model, speculative.num_speculative_tokens, **options)

    @property
    def draft_model(self) -> DraftModelProposer | None:
        return None if self.speculative is None else self.speculative.draft_model

    # ------------------------------------------------------------------ KV cache

    def determine_num_gpu_blocks(self, max_num_batched_tokens: int, grouping: KVCacheGrouping | None = None) -> int:
        """``grouping``: a hybrid KV cache's, whose blocks each hold one group's layers."""
        config = self.config
        return determine_num_gpu_blocks(
            self.model_config, block_size=self.block_size, dtype=self.dtype, device=self.device,
            max_num_seqs=self.max_num_reqs, max_model_len=self.max_model_len,
            max_num_batched_tokens=max_num_batched_tokens, num_gpu_blocks=config.num_gpu_blocks,
            kv_cache_memory_bytes=config.kv_cache_memory_bytes, gpu_memory_utilization=config.gpu_memory_utilization,
            num_kv_cache_groups=1 if grouping is None else len(grouping.windows),
            layers_per_block=None if grouping is None else grouping.layers_per_block,
            extra_bytes_per_block=0 if self.draft_model is None else self.draft_model.bytes_per_block(self.block_size))

    def determine_num_offload_blocks(self, size_gib: float) -> int:
        """Blocks of this model's KV (every layer) that ``size_gib`` of host memory holds."""
        model_config = self.model_config
        block_bytes = kv_cache_bytes_per_block(model_config.num_hidden_layers, self.block_size,
                                               model_config.num_key_value_heads, model_config.head_dim, self.dtype,
                                               model_config.value_head_dim)
        return int(size_gib * 2**30 // block_bytes)

    def initialize_kv_cache(self, num_gpu_blocks: int, num_offload_blocks: int = 0,
                            grouping: KVCacheGrouping | None = None) -> None:
        """``grouping``: vLLM's hybrid KV cache (engine/core/kv_cache_grouping.py): one block table per group, each
        layer's KV in its group's blocks at its slot; the scheduler's cache config must have its groups."""
        model_config = self.model_config
        if grouping is None:
            self.kv_caches = allocate_kv_caches(model_config.num_hidden_layers, num_gpu_blocks, self.block_size,
                                                model_config.num_key_value_heads, model_config.head_dim, self.dtype,
                                                self.device, value_head_size=model_config.value_head_dim)
        else:
            if num_offload_blocks:
                raise ValueError("KV offloading is not supported with a hybrid KV cache")
            # A draft model keeps its KV beside group 0's blocks (the batch's block table and slot mapping are group
            # 0's, draft_model.py): a full-attention group, whose blocks are never handed back while a request runs.
            if self.draft_model is not None and grouping.windows[0] is not None:
                raise ValueError(f"a draft model needs a full-attention first KV-cache group, got {grouping.windows}")
            self.kv_caches = allocate_grouped_kv_caches(
                grouping, model_config.num_hidden_layers, num_gpu_blocks, self.block_size,
                model_config.num_key_value_heads, model_config.head_dim, self.dtype, self.device,
                value_head_size=model_config.value_head_dim)
            self.input_batch.use_block_table_per_group(len(grouping.windows))
        self.kv_cache_grouping = grouping
        self.num_gpu_blocks = num_gpu_blocks
        if self.draft_model is not None:
            if num_offload_blocks:
                raise ValueError("speculative_config with a draft model does not run with KV offloading")
            self.draft_model.allocate(num_gpu_blocks, self.block_size)
        if num_offload_blocks:
            self.host_kv_cache = HostKVCache(model_config.num_hidden_layers, num_offload_blocks, self.block_size,
                                             model_config.num_key_value_heads, model_config.head_dim, self.dtype,
                                             self.device, value_head_size=model_config.value_head_dim)
        if self.device.type == "cuda":
            runs = warm_up_shapes(self.model, self.kv_caches, self.device,
                                  max_num_tokens=self.config.max_num_batched_tokens,
                                  padding=self.eager_token_padding, max_num_reqs=self.max_num_reqs)
            logger.info("warmed up %d padded token counts (multiples of %d)", runs, self.eager_token_padding)
        if self.cuda_graphs_off_reason is None:
            self.decode_graphs = self.make_decode_graphs()
            self.decode_graphs.capture()
        elif self.device.type == "cuda":
            logger.info("decode steps run without CUDA graphs: %s", self.cuda_graphs_off_reason)

    def make_decode_graphs(self, emulate: bool = False) -> DecodeGraphs:
        """Graphs over this runner's model and KV caches (``emulate``: the padded forward, eagerly)."""
        return DecodeGraphs(self.model, self.kv_caches, max_num_reqs=self.max_num_reqs,
                            max_num_blocks_per_req=self.input_batch.block_table.block_table.shape[1],
                            max_model_len=self.max_model_len, device=self.device,
                            batch_size_ladder=self.config.cuda_graph_batch_sizes, emulate=emulate,
                            num_kv_cache_groups=1 if self.kv_cache_grouping is None else len(self.kv_cache_grouping.windows))

    def _zero_blocks(self, block_ids: list[int]) -> None:
        """Clear reused blocks so no kernel can read a previous owner's values (the seed's _zero_block_ids)."""
        index = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        for key_cache, value_cache in self.kv_caches:
            key_cache.index_fill_(0, index, 0)
            value_cache.index_fill_(0, index, 0)
        if self.draft_model is not None:
            self.draft_model.zero_blocks(index)

    # ------------------------------------------------------------------ state sync

    def _update_states(self, scheduler_output: SchedulerOutput) -> None:
        update_states(self, scheduler_output)

    def _check_pooling(self, pooling_params):
        # Only a pooling runner looks for pooling rows in its steps: a generating one never pays that scan.
        if pooling_params is not None and not self.config.pooling:
            raise ValueError("an embedding request reached a runner created for generation (RunnerConfig.pooling is "
                             "false); create the engine with runner='pooling'")
        return pooling_params

    def _check_lora(self, lora_request):
        if lora_request is not None and self.lora is None:
            raise ValueError(f"a request names LoRA adapter {lora_request.lora_name!r} but this runner was created "
                             "without LoRA (RunnerConfig.lora_config)")
        return lora_request

    def _check_images(self, mm_features):
        if mm_features and self.encoder_outputs is None:
            raise ValueError(f"a request with images reached a runner whose model {str(self.config.model)!r} encodes "
                             "none (text only)")
        return mm_features

    def _new_grammar(self, req_id: str, params, prompt_token_ids: list[int] = ()):
        """The request's grammar matcher, or None when it asks for no structured outputs. The front end checked
        the grammar when the request was added (engine/request_inputs.py), so compiling here cannot fail
        for a request that came through it; a runner driven directly gets the same ValueError."""
        if params.structured_outputs is None:
            return None
        if self.structured_outputs is None:
            raise ValueError("SamplingParams.structured_outputs needs a grammar backend; this runner was created "
                             "without one (build_engine gives it one)")
        grammar = self.structured_outputs.new_request_grammar(req_id, params.structured_outputs, prompt_token_ids)
        self.grammar_req_ids.add(req_id)
        return grammar

    # ------------------------------------------------------------------ one step

    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        started = time.perf_counter()
        # KV offloading's copies around the zeroing of new blocks, in the order host_kv_cache.py explains.
        host = self.host_kv_cache
        if (scheduler_output.offload_stores or scheduler_output.offload_loads) and host is None:
            raise RuntimeError("the scheduler offloads KV blocks but this runner has no host cache: pass "
                               "num_offload_blocks to initialize_kv_cache()")
        if scheduler_output.offload_stores:
            host.store(self.kv_caches, scheduler_output.offload_stores)
        self._update_states(scheduler_output)
        if self.encoder_outputs is not None:
            self.encoder_outputs.update(scheduler_output, self.requests)
        finished_kv_loads = host.load(self.kv_caches, scheduler_output.offload_loads) \
            if scheduler_output.offload_loads else []
        batch = self.input_batch
        num_reqs = batch.num_reqs
        if scheduler_output.total_num_scheduled_tokens == 0 or num_reqs == 0:
            self.last_step_duration_s = time.perf_counter() - started
            return ModelRunnerOutput([], {}, [], finished_kv_loads=finished_kv_loads)
        if not self.kv_caches:
            raise RuntimeError("initialize_kv_cache() must be called before execute_model()")

        req_ids = list(batch.req_ids)
        draft_rows = SpeculativeStep.write_drafts(batch, scheduler_output.scheduled_spec_decode_tokens) \
            if scheduler_output.scheduled_spec_decode_tokens else {}
        scheduled = scheduler_output.num_scheduled_tokens
        num_scheduled_tokens = np.fromiter((scheduled[req_id] for req_id in req_ids), dtype=np.int32,
                                           count=num_reqs)
        prepared = prepare_inputs(batch, num_scheduled_tokens)
        # The step's rows per LoRA adapter (None when no row has one: then the forward does no LoRA work).
        lora_batch = self.lora.prepare_step(batch, num_scheduled_tokens) if self.lora is not None else None
        # Images' embeddings for the placeholder tokens of this step (None: no placeholder is scheduled).
        placeholders = self.encoder_outputs.placeholder_embeddings(
            batch.request_states[:num_reqs], prepared.common.num_computed_tokens, num_scheduled_tokens) \
            if self.encoder_outputs is not None else None
        # Gemma 3: the spans of images the step computes, attended both ways (None: every row causal).
        spans = bidirectional_spans(batch.request_states[:num_reqs], prepared.common.num_computed_tokens,
                                    num_scheduled_tokens) \
            if placeholders is not None and self.encoder_outputs.encoder.bidirectional_image_attention else None
        # M-RoPE's three positions for a step with a request that shows images (None: the plain positions).
        mrope = batch_mrope_positions(batch.request_states[:num_reqs], prepared.common.num_computed_tokens,
                                      num_scheduled_tokens) if self.mrope_merge_size else None
        if mrope is not None and (plain := as_plain_positions(mrope)) is not None:
            # Decodes of requests with images (index + delta): plain positions, which a graph can replay.
            prepared.positions, mrope = plain, None
        graphs = self.decode_graphs
        try:
            # Captured graphs hold no adapter and read token ids only: a step with an adapter or with an image's
            # placeholders runs eagerly (engine/runner/lora/).
            if graphs is not None and lora_batch is None and placeholders is None and mrope is None \
                    and graphs.handles(prepared):
                tables = getattr(batch.block_table, "tables", None)
                hidden_states = graphs.forward(prepared, batch.block_table.block_table[:num_reqs] if tables is None
                                               else [table.block_table[:num_reqs] for table in tables])
            else:
                input_ids, positions, common = pad_step_inputs(prepared.input_ids, prepared.positions,
                                                               prepared.common, self.eager_token_padding)
                attn_metadata = step_attention_metadata(self.metadata_builder, prepared, common,
                                                        self.eager_token_padding, self.kv_cache_grouping,
                                                        self.attention_chunk_size, self.block_size, spans)
                input_ids = torch.from_numpy(input_ids).to(self.device, non_blocking=True)
                if mrope is not None:
                    positions = padded_columns(mrope, len(positions))
                positions = torch.from_numpy(positions).to(self.device, non_blocking=True)
                if placeholders is None:
                    hidden_states = self.model(input_ids, positions, self.kv_caches, attn_metadata)
                else:
                    inputs_embeds = fill_placeholders(self.model.embed_input_ids(input_ids), placeholders)
                    deepstack = deepstack_inputs(placeholders, inputs_embeds.shape[1])
                    hidden_states = self.model(input_ids, positions, self.kv_caches, attn_metadata,
                                               inputs_embeds=inputs_embeds,
                                               **({} if deepstack is None else {"deepstack": deepstack}))
        finally:
            if lora_batch is not None:
                self.lora.finish_step()

        states = batch.request_states[:num_reqs]
        prompt_logprobs = None
        if any_prompt_logprobs(states, prepared.common.is_prefilling):
            prompt_logprobs = self.prompt_logprobs.collect(states, prepared, hidden_states,
                                                           self.model.compute_logits) or None

        sampled_token_ids: list[list[int]] = [[] for _ in range(num_reqs)]
        logprobs = None
        sampled_rows, logits_indices = prepared.sampled_rows, prepared.logits_indices
        pooler_output = None
        if self.config.pooling and any_pooling(states):
            pooler_output = self.pooling.collect(states, prepared, hidden_states) or None
            pooled = give_placeholder_tokens(batch, states, sampled_rows, sampled_token_ids)
            sampled_rows, logits_indices = sampled_rows[~pooled], logits_indices[~pooled]
        if len(sampled_rows) and draft_rows:
            tokens_by_row, logprobs = self.speculative.sample_and_verify(
                batch, prepared, hidden_states, self.model.compute_logits, draft_rows, self._sample_rows,
                self.structured_outputs.backend if self.grammar_req_ids else None)
            logprobs = logprobs or None
            for row, tokens in tokens_by_row.items():
                batch.append_row_token_ids(row, tokens)
                states[row].output_token_ids.extend(tokens)
                sampled_token_ids[row] = tokens
        elif len(sampled_rows):
            logits_indices = torch.from_numpy(logits_indices).to(self.device, non_blocking=True)
            tokens, logprobs = self._sample_rows(sampled_rows, hidden_states[logits_indices])
            batch.append_token_ids(sampled_rows, np.asarray(tokens, dtype=np.int32))
            for row, token in zip(sampled_rows.tolist(), tokens):
                states[row].output_token_ids.append(token)
                sampled_token_ids[row] = [token]
        spec_token_ids = {}
        if self.speculative is not None and (len(sampled_rows) or self.draft_model is not None):
            spec_token_ids = self.speculative.propose(batch, sampled_rows.tolist(), prepared, self.metadata_builder,
                                                      hidden_states)

        self.num_steps += 1
        self.last_step_duration_s = time.perf_counter() - started
        return ModelRunnerOutput(req_ids, {req_id: row for row, req_id in enumerate(req_ids)}, sampled_token_ids,
                                 logprobs=logprobs, prompt_logprobs=prompt_logprobs, pooler_output=pooler_output,
                                 finished_kv_loads=finished_kv_loads, spec_token_ids=spec_token_ids)

    def _sample_rows(self, rows: np.ndarray, hidden_states: torch.Tensor) -> tuple[list[int], dict | None]:
        """One token for each batch row in ``rows`` from its last position's hidden state, and the logprobs by
        request id of the rows that ask for them (None when none does)."""
        logits = self.model.compute_logits(hidden_states)
        sampling_states = [self.input_batch.request_states[row] for row in rows.tolist()]
        # Structured outputs: the grammar masks go on first, before every logits processor (vLLM's order).
        # One position per row: rows with drafts are masked position by position in their verification
        # (spec_decode/runner_step.py).
        grammars = constrained_rows(sampling_states) if self.grammar_req_ids else None
        if grammars:
            apply_grammar_masks(logits, grammars, self.structured_outputs.backend)
        metadata = self.sampling_metadata_cache.get(sampling_states)
        sampler_output = self.sampler(logits, metadata)
        tokens = sampler_output.sampled_token_ids.tolist()  # the step's one device sync
        if self.grammar_req_ids:
            for state, token in zip(sampling_states, tokens):
                if state.grammar is not None:
                    state.grammar.accept(token)
        if sampler_output.logprobs is None:
            return tokens, None
        return tokens, split_logprobs(sampler_output.logprobs, metadata.num_logprobs,
                                      [state.req_id for state in sampling_states])

    @property
    def model_path(self) -> Path:
        return Path(self.config.model)

