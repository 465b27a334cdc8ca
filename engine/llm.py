"""``LLM``: offline batch generation, shaped like vLLM's (the seed's section 3.1 entry point).

    llm = LLM(model="tiny")
    outputs = llm.generate(["Hello", "The engine"], SamplingParams(max_tokens=32))

``generate`` validates every prompt and its sampling parameters *before* adding any request, so a bad
input raises ``ValueError`` (naming the prompt's index) and leaves nothing behind in the engine. Once
requests are in, each step is: ``EngineCore.step()`` (schedule, run the model, update), then the output
processor (detokenize, stop strings, logprobs); requests ended by a stop string are finished in the
core at once. If the loop is interrupted (an exception, Ctrl-C), the call's unfinished requests are
aborted, so their KV blocks return to the pool and the engine stays usable.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from tqdm.auto import tqdm

from engine.beam_search import BeamSearchOutput, BeamSearchParams, run_beam_search
from engine.chat_images import image_token, mark_images
from engine.chat_template import check_messages, render_chat
from engine.core import EngineCore, LoRARequest, PoolingParams, SamplingParams, Scheduler
from engine.embedding_scores import cosine_similarity, distinct_inputs, score_pairs, score_texts
from engine.engine_args import EngineArgs
from engine.engine_components import build_engine
from engine.front_end_step import step_front_end
from engine.output_processor import OutputProcessor
from engine.outputs import RequestOutput
from engine.parallel_sampling import ParentRequest
from engine.cross_encoder import check_cross_encoder, pair_prompt
from engine.pooling_outputs import (ClassificationRequestOutput, EmbeddingRequestOutput, ScoringOutput,
                                    ScoringRequestOutput)
from engine.pooling_requests import (CLASSIFY_ON_EMBEDDING, EMBED_ON_CLASSIFIER, EMBED_ON_GENERATE,
                                     GENERATE_ON_POOLING, POOLING_SAMPLING_PARAMS, pooling_labels,
                                     resolve_pooling_params)
from engine.request_inputs import (Prompt, check_priority, is_token_id, make_core_request, parse_prompt,
                                   refuse_images_in_beam_search, truncate_prompt, validate_request)

logger = logging.getLogger(__name__)


class LLM:
    def __init__(
        self,
        model: str | None = None,
        tokenizer: str | None = None,
        dtype: str = "auto",
        device: str = "cpu",
        block_size: int = 16,
        enable_prefix_caching: bool = True,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 8192,
        max_model_len: int | None = None,
        num_gpu_blocks: int | None = None,
        kv_cache_memory_bytes: int | None = None,
        enable_chunked_prefill: bool = True,
        long_prefill_token_threshold: int = 0,
        attention_backend: str | None = None,
        seed: int = 0,
        scheduling_policy: str = "fcfs",
        prefix_cache_eviction_policy: str = "lru",
        skip_tokenizer_init: bool = False,
        gpu_memory_utilization: float = 0.9,
        enforce_eager: bool = False,
        kv_offloading_size_gib: float = 0.0,
        disable_hybrid_kv_cache_manager: bool = False,
        speculative_config: dict | str | None = None,
        enable_lora: bool = False,
        max_loras: int = 1,
        max_lora_rank: int = 16,
        max_cpu_loras: int | None = None,
        runner: str = "generate",
        pooler_config: dict | str | None = None,
        max_num_encoder_input_tokens: int | None = None,
        encoder_cache_size: int | None = None,
        disable_chunked_mm_input: bool = False,
        reasoning_parser: str | None = None,
        structured_outputs_in_reasoning: bool = False,
    ) -> None:
        args = EngineArgs(
            model=model, tokenizer=tokenizer, skip_tokenizer_init=skip_tokenizer_init, dtype=dtype, device=device,
            block_size=block_size, enable_prefix_caching=enable_prefix_caching, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
            num_gpu_blocks=num_gpu_blocks, kv_cache_memory_bytes=kv_cache_memory_bytes,
            gpu_memory_utilization=gpu_memory_utilization, enable_chunked_prefill=enable_chunked_prefill,
            long_prefill_token_threshold=long_prefill_token_threshold, attention_backend=attention_backend,
            seed=seed, scheduling_policy=scheduling_policy, prefix_cache_eviction_policy=prefix_cache_eviction_policy,
            enforce_eager=enforce_eager,
            kv_offloading_size_gib=kv_offloading_size_gib,
            disable_hybrid_kv_cache_manager=disable_hybrid_kv_cache_manager, speculative_config=speculative_config,
            enable_lora=enable_lora, max_loras=max_loras, max_lora_rank=max_lora_rank, max_cpu_loras=max_cpu_loras,
            runner=runner, pooler_config=pooler_config, max_num_encoder_input_tokens=max_num_encoder_input_tokens,
            encoder_cache_size=encoder_cache_size, disable_chunked_mm_input=disable_chunked_mm_input,
            reasoning_parser=reasoning_parser, structured_outputs_in_reasoning=structured_outputs_in_reasoning)
        self.engine_args = args
        components = build_engine(args)
        self.tokenizer = components.tokenizer
        self.model_runner = components.model_runner
        self.executor = components.executor
        self.engine_core = components.engine_core
        self.output_processor = OutputProcessor(self.tokenizer)
        self.eos_token_ids = components.eos_token_ids
        # Images in prompts (engine/multimodal_inputs.py); None: a text-only model.
        self.image_inputs = components.image_inputs
        self._request_counter = itertools.count()

    # ------------------------------------------------------------------ accessors

    @property
    def llm_engine(self) -> EngineCore:
        return self.engine_core

    @property
    def scheduler(self) -> Scheduler:
        return self.engine_core.scheduler

    def get_tokenizer(self):
        return self.tokenizer

    def reset_prefix_cache(self) -> bool:
        """Forget every prefix the KV cache holds (vLLM's ``LLM.reset_prefix_cache``), so that the next prompts
        run cold. False while a request holds blocks (none does between ``generate`` calls); the host tier of KV
        offloading keeps its blocks, as vLLM's connector does by default."""
        return self.engine_core.scheduler.reset_prefix_cache()

    # ------------------------------------------------------------------ generation

    def generate(self, prompts: Any, sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True, priority: Sequence[int] | None = None,
                 lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None) -> list[RequestOutput]:
        """One RequestOutput per prompt, in input order.

        ``prompts``: a string, a list of strings, a list of token-id lists, or dicts with
        ``prompt_token_ids`` (and optionally ``prompt`` text) or ``prompt``; one token-id list or dict
        is one prompt. ``sampling_params``: one for all prompts, or one per prompt (default: vLLM's
        defaults, i.e. 16 tokens at temperature 1). ``priority``: one integer per prompt, lower served
        first (with ``scheduling_policy="priority"``, as in vLLM). With ``SamplingParams(n=k)`` a prompt's
        output holds its k completions in ``outputs``, by index. ``lora_request``: the LoRA adapter (a
        ``LoRARequest``) for every prompt, or a list of one per prompt (None: the base model); needs
        ``enable_lora=True``, and each adapter is read and checked before any request is added.
        """
        if self.engine_args.is_pooling:
            raise ValueError(GENERATE_ON_POOLING)
        parsed = self._parse_prompts(prompts)
        params = self._expand_sampling_params(sampling_params, len(parsed))
        priorities = self._check_priorities(priority, len(parsed))
        lora_requests = self._expand_lora_requests(lora_request, len(parsed))
        parsed = [truncate_prompt(f"prompt {index}", prompt, request_params, self.scheduler.max_model_len)
                  for index, (prompt, request_params) in enumerate(zip(parsed, params))]
        for index, (prompt, request_params, request_lora) in enumerate(zip(parsed, params, lora_requests)):
            self._validate(index, prompt, request_params, request_lora)
        request_ids = [f"{next(self._request_counter)}" for _ in parsed]
        # n > 1: the prompt's n completions are n engine requests, gathered back into one output.
        parents = {request_id: ParentRequest(request_id, request_params, "final")
                   for request_id, request_params in zip(request_ids, params) if request_params.n > 1}
        added: list[str] = []
        try:
            for request_id, prompt, request_params, request_priority, request_lora in zip(
                    request_ids, parsed, params, priorities, lora_requests):
                parent = parents.get(request_id)
                engine_requests = (zip(parent.child_ids, parent.child_params) if parent is not None
                                   else [(request_id, request_params)])
                for engine_request_id, engine_params in engine_requests:
                    added.append(engine_request_id)  # before adding: aborting an id the core lacks is harmless
                    self._add_request(engine_request_id, prompt, engine_params, request_priority, request_lora)
            finished = self._run_engine(set(request_ids), parents, use_tqdm)
        except BaseException:
            self._abort(added)
            raise
        return [finished[request_id] for request_id in request_ids]

    def beam_search(self, prompts: Any, params: BeamSearchParams) -> list[BeamSearchOutput]:
        """vLLM's ``LLM.beam_search``: one BeamSearchOutput per prompt (prompts as ``generate`` takes them), each
        holding the best ``params.beam_width`` sequences, best first (engine/beam_search.py). Every round is one
        ``generate`` call for all live beams, so a bad prompt raises before any request is added."""
        if not isinstance(params, BeamSearchParams):
            raise ValueError(f"params must be a BeamSearchParams, got {type(params).__name__}")
        parsed = self._parse_prompts(prompts)
        max_model_len = self.scheduler.max_model_len
        for index, prompt in enumerate(parsed):
            refuse_images_in_beam_search(f"prompt {index}", prompt)
            self._validate(index, prompt, params.round_sampling_params())
            if len(prompt.token_ids) + params.max_tokens > max_model_len:  # the last round's prompt would not fit
                raise ValueError(f"prompt {index} has {len(prompt.token_ids)} tokens; with max_tokens="
                                 f"{params.max_tokens} the beams outgrow the engine's max_model_len {max_model_len}")

        def generate_round(sequences: list[list[int]], round_params: SamplingParams) -> list[RequestOutput]:
            return self.generate([{"prompt_token_ids": ids} for ids in sequences], round_params, use_tqdm=False)

        decode = None if self.tokenizer is None else (
            lambda ids: self.tokenizer.decode(ids, skip_special_tokens=False))
        return run_beam_search([prompt.token_ids for prompt in parsed], params, self.eos_token_ids, generate_round,
                               decode)

    def embed(self, prompts: Any, pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
              use_tqdm: bool = True) -> list[EmbeddingRequestOutput]:
        """vLLM's ``LLM.embed``: one EmbeddingRequestOutput per prompt, in input order, on an engine created with
        ``runner="pooling"``. ``prompts`` as ``generate`` takes them; ``pooling_params``: one for all prompts or
        one per prompt (``dimensions``, ``normalize``; the pooling type is the engine's ``pooler_config``).
        Every prompt and its parameters are checked before any request is added."""
        if not self.engine_args.is_pooling:
            raise ValueError(EMBED_ON_GENERATE)
        if self.labels is not None:
            raise ValueError(EMBED_ON_CLASSIFIER)
        parsed = self._parse_prompts(prompts)
        if pooling_params is None or isinstance(pooling_params, PoolingParams):
            pooling_params = [pooling_params] * len(parsed)
        elif isinstance(pooling_params, (str, bytes)) or not isinstance(pooling_params, Sequence) \
                or len(pooling_params) != len(parsed):
            raise ValueError(f"pooling_params must be a PoolingParams, or a list of one per prompt ({len(parsed)})")
        hidden_size = self.model_runner.model_config.hidden_size
        params = [resolve_pooling_params(f"prompt {index}", request_params, self.engine_args.pooler_config,
                                         hidden_size) for index, request_params in enumerate(pooling_params)]
        return [EmbeddingRequestOutput.from_request_output(output) for output in self._pool(parsed, params, use_tqdm)]

    @property
    def labels(self) -> list[str] | None:
        """The model's classification labels when it is a sequence classifier (``classify``), else None."""
        return pooling_labels(self.model_runner.model)

    def classify(self, prompts: Any, use_tqdm: bool = True) -> list[ClassificationRequestOutput]:
        """vLLM's ``LLM.classify``: each prompt's label probabilities, on a sequence-classification checkpoint run
        with ``runner="pooling"`` (engine/models/sequence_classification.py). Prompts as ``generate`` takes them."""
        if not self.engine_args.is_pooling:
            raise ValueError(EMBED_ON_GENERATE)
        if self.labels is None:
            raise ValueError(CLASSIFY_ON_EMBEDDING)
        parsed = self._parse_prompts(prompts)
        params = resolve_pooling_params("prompt", None, self.engine_args.pooler_config,
                                        self.model_runner.model_config.hidden_size)
        return [ClassificationRequestOutput.from_request_output(output)
                for output in self._pool(parsed, [params] * len(parsed), use_tqdm)]

    def _pool(self, parsed: list, params: list[PoolingParams], use_tqdm: bool) -> list[RequestOutput]:
        """Pooling requests for ``parsed`` prompts, each checked before any is added; their outputs, in order."""
        for index, prompt in enumerate(parsed):
            self._validate(index, prompt, POOLING_SAMPLING_PARAMS)
        request_ids = [f"{next(self._request_counter)}" for _ in parsed]
        added: list[str] = []
        try:
            for request_id, prompt, request_params in zip(request_ids, parsed, params):
                added.append(request_id)
                self._add_request(request_id, prompt, POOLING_SAMPLING_PARAMS, pooling_params=request_params)
            finished = self._run_engine(set(request_ids), {}, use_tqdm)
        except BaseException:
            self._abort(added)
            raise
        return [finished[request_id] for request_id in request_ids]

    def score(self, data_1: Any, data_2: Any, use_tqdm: bool = True) -> list[ScoringRequestOutput]:
        """vLLM's ``LLM.score`` (``runner="pooling"``), for one text against each of ``data_2`` (1:N) or pairwise
        (N:N); a text is a string or a token-id list. On an embedding model: the cosine similarity of the two
        texts' embeddings, each distinct text embedded once (engine/embedding_scores.py). On a cross-encoder (a
        sequence classifier of one label): the sigmoid of its logit for the pair read as one prompt
        (engine/cross_encoder.py). One output per pair, in order."""
        texts_1, texts_2 = score_texts(data_1, "data_1"), score_texts(data_2, "data_2")
        pairs = score_pairs(len(texts_1), len(texts_2))
        if self.labels is not None:
            check_cross_encoder(self.labels)
            prompts = [{"prompt_token_ids": pair_prompt(self.tokenizer, texts_1[first], texts_2[second])}
                       for first, second in pairs]
            return [ScoringRequestOutput(str(index), ScoringOutput(output.outputs.probs[0]), output.prompt_token_ids)
                    for index, output in enumerate(self.classify(prompts, use_tqdm=use_tqdm))]
        distinct, positions = distinct_inputs(texts_1 + texts_2)
        embeddings = self.embed([text if isinstance(text, str) else {"prompt_token_ids": text} for text in distinct],
                                use_tqdm=use_tqdm)
        outputs = []
        for index, (first, second) in enumerate(pairs):
            a, b = embeddings[positions[first]], embeddings[positions[len(texts_1) + second]]
            outputs.append(ScoringRequestOutput(str(index), ScoringOutput(cosine_similarity(
                a.outputs.embedding, b.outputs.embedding)), a.prompt_token_ids + b.prompt_token_ids))
        return outputs

    def chat(self, messages: Any, sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             use_tqdm: bool = True, add_generation_prompt: bool = True,
             priority: Sequence[int] | None = None,
             lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
             chat_template_kwargs: dict[str, Any] | None = None,
             chat_template: str | None = None, tools: list[dict[str, Any]] | None = None,
             continue_final_message: bool = False) -> list[RequestOutput]:
        """vLLM's ``LLM.chat``: one conversation (a list of ``{"role", "content"}`` messages) or a list of
        them, each through the model's chat template (engine/chat_template.py, as the server's chat route
        renders it; ``chat_template_kwargs``, the template's own variables such as Qwen3's ``enable_thinking``;
        ``chat_template``, a Jinja template used instead of the tokenizer's; ``tools``, OpenAI's function definitions,
        for templates that render them; ``continue_final_message``, the last message left open for the model to
        continue, with ``add_generation_prompt=False``), then ``generate``. One RequestOutput per conversation, in
        order."""
        single = isinstance(messages, Sequence) and not isinstance(messages, (str, bytes)) and bool(messages) \
            and isinstance(messages[0], Mapping)
        conversations = [messages] if single else messages
        if isinstance(conversations, (str, bytes)) or not isinstance(conversations, Sequence) or not conversations:
            raise ValueError(f"messages must be a conversation (a list of messages) or a list of them, "
                             f"got {messages!r:.80}")
        prompts = [self._render_chat(check_messages(conversation, "messages" if single else f"messages[{index}]"),
                                     add_generation_prompt, chat_template_kwargs, chat_template,
                                     tools=tools, continue_final_message=continue_final_message)
                   for index, conversation in enumerate(conversations)]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm, priority=priority,
                             lora_request=lora_request)

    def _render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool,
                     template_kwargs: dict[str, Any] | None = None, chat_template: str | None = None, *,
                     tools: list[dict[str, Any]] | None = None, continue_final_message: bool = False) -> dict[str, Any]:
        """The conversation's prompt, with its images (content parts: engine/chat_images.py) as multi_modal_data."""
        images = mark_images(messages, image_token(self.image_inputs, self.tokenizer),
                             chat_template or getattr(self.tokenizer, "chat_template", None))
        rendered = render_chat(self.tokenizer, messages, add_generation_prompt, tools=tools,
                               template_kwargs=template_kwargs, chat_template=chat_template,
                               continue_final_message=continue_final_message)
        return {**rendered, "multi_modal_data": {"image": images}} if images else rendered

    def _check_priorities(self, priority: Sequence[int] | None, num_prompts: int) -> list[int]:
        if priority is None:
            return [0] * num_prompts
        if isinstance(priority, (str, bytes)) or not isinstance(priority, Sequence) or len(priority) != num_prompts:
            raise ValueError(f"priority must be a list of one integer per prompt ({num_prompts}), got {priority!r}")
        policy = self.scheduler.scheduler_config.policy
        return [check_priority(value, policy, f"priority[{index}]") for index, value in enumerate(priority)]

    @staticmethod
    def _expand_lora_requests(lora_request: Any, num_prompts: int) -> list[LoRARequest | None]:
        if lora_request is None or isinstance(lora_request, LoRARequest):
            return [lora_request] * num_prompts
        if isinstance(lora_request, (str, bytes)) or not isinstance(lora_request, Sequence) \
                or len(lora_request) != num_prompts:
            raise ValueError(f"lora_request must be a LoRARequest, or a list of one per prompt ({num_prompts}) "
                             f"holding LoRARequests or None, got {lora_request!r:.200}")
        for index, value in enumerate(lora_request):
            if value is not None and not isinstance(value, LoRARequest):
                raise ValueError(f"lora_request[{index}] must be a LoRARequest or None, got {type(value).__name__}")
        return list(lora_request)

    def _add_request(self, request_id: str, prompt: Prompt, params: SamplingParams, priority: int = 0,
                     lora_request: LoRARequest | None = None, pooling_params: PoolingParams | None = None) -> None:
        arrival_time = time.monotonic()
        request = make_core_request(request_id, prompt, params, self.eos_token_ids, arrival_time, priority,
                                    lora_request, pooling_params)
        self.output_processor.add_request(request_id, prompt.text, prompt.token_ids, request.sampling_params,
                                          arrival_time)
        self.engine_core.add_request(request)

    def _run_engine(self, request_ids: set[str], parents: dict[str, ParentRequest],
                    use_tqdm: bool) -> dict[str, RequestOutput]:
        """Step until every prompt in ``request_ids`` has its output (a parent's once all its children finish)."""
        finished: dict[str, RequestOutput] = {}
        child_parents = {child_id: parent for parent in parents.values() for child_id in parent.child_ids}
        engine_core, output_processor = self.engine_core, self.output_processor
        progress = tqdm(total=len(request_ids), desc="Processed prompts", unit="req", disable=not use_tqdm,
                        dynamic_ncols=True)
        started, num_output_tokens = time.perf_counter(), 0
        try:
            while len(finished) < len(request_ids):
                if not engine_core.has_work():
                    missing = sorted(request_ids - finished.keys())
                    raise RuntimeError(f"the engine has no work left but requests {missing[:5]} never finished")
                _, processed = step_front_end(engine_core, output_processor, self.executor.take_prompt_logprobs,
                                              self.executor.take_pooler_output)
                for output in processed.request_outputs:
                    parent = child_parents.get(output.request_id)
                    if not output.finished or (parent is None and output.request_id not in request_ids):
                        continue
                    num_output_tokens += len(output.outputs[0].token_ids)
                    if parent is not None:
                        output = parent.add_child_output(output)
                        if output is None:
                            continue
                    finished[output.request_id] = output
                    progress.update(1)
                    elapsed = time.perf_counter() - started
                    progress.set_postfix_str(f"output {num_output_tokens / max(elapsed, 1e-9):.1f} tok/s",
                                             refresh=False)
        finally:
            progress.close()
        return finished

    def _abort(self, request_ids: list[str]) -> None:
        self.engine_core.abort_requests(request_ids)
        self.output_processor.abort_requests(request_ids)

    # ------------------------------------------------------------------ input handling

    def _parse_prompts(self, prompts: Any) -> list[Prompt]:
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, (list, tuple)) and prompts
                                                and all(is_token_id(t) for t in prompts)):
            prompts = [prompts]
        if not isinstance(prompts, (list, tuple)):
            raise ValueError(f"prompts must be a string, a list of strings, of token-id lists or of dicts, "
                             f"got {type(prompts).__name__}")
        return [self._parse_prompt(index, prompt) for index, prompt in enumerate(prompts)]

    def _parse_prompt(self, index: int, prompt: Any) -> Prompt:
        return parse_prompt(f"prompt {index}", prompt, self.tokenizer, self.model_runner.vocab_size,
                            self.image_inputs)

    @staticmethod
    def _expand_sampling_params(sampling_params: Any, num_prompts: int) -> list[SamplingParams]:
        if sampling_params is None:
            return [SamplingParams()] * num_prompts
        if isinstance(sampling_params, SamplingParams):
            return [sampling_params] * num_prompts
        params = list(sampling_params)
        if len(params) != num_prompts:
            raise ValueError(f"got {len(params)} SamplingParams for {num_prompts} prompts; pass one, or one per prompt")
        for index, p in enumerate(params):
            if not isinstance(p, SamplingParams):
                raise ValueError(f"sampling_params[{index}] must be a SamplingParams, got {type(p).__name__}")
        return params

    def _validate(self, index: int, prompt: Prompt, params: SamplingParams,
                  lora_request: LoRARequest | None = None) -> None:
        validate_request(f"prompt {index}", prompt, params, self.scheduler, self.model_runner.vocab_size,
                         self.tokenizer is not None, self.model_runner.structured_outputs, lora_request,
                         self.model_runner.lora)
