"""``AsyncLLM``: the streaming front end (the seed's section 3, async path, and 9.2).

    async with AsyncLLM(model="tiny") as llm:
        async for output in llm.generate("Hello", SamplingParams(max_tokens=16), request_id="r1"):
            print(output.outputs[0].text, end="")      # the new text of this step
            # the last output has finished=True and a finish_reason

``generate`` = vLLM's ``AsyncLLM.generate -> add_request``: the prompt is parsed and validated here, on
the event loop (a bad prompt raises in that request's iterator, and nothing reaches the engine), then
the request goes to the engine thread (``engine.engine_loop``), which steps the ``EngineCore`` and
runs the output processor, and hands each step's outputs back with ``loop.call_soon_threadsafe``.

Outputs are deltas by default (``output_kind="delta"``: each carries only the text, token ids and
logprobs its step added; when the consumer falls behind, consecutive deltas are merged), or
``"cumulative"`` (each carries everything so far). Either way the last one has ``finished=True``.
With ``SamplingParams(n=k)`` the k completions stream together, each ``CompletionOutput`` with its
``index`` (an output may carry several); the request finishes when the last of them does.

Leaving the iterator early (``break``, a cancelled task, a client that disconnected) aborts the request
in the engine, which frees its KV blocks. ``abort(request_id)`` from elsewhere ends the iterator with
a final output whose finish_reason is ``abort``. ``shutdown()`` (or leaving ``async with``) aborts every
request in flight and stops the engine thread.

The front end tokenizes with its own tokenizer instance: Hugging Face tokenizers must not be used
from two threads at once, and the engine thread detokenizes with the other one.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from typing import Any

from engine.beam_search import BeamSearch, BeamSearchOutput, BeamSearchParams
from engine.core import LoRARequest, PoolingParams, SamplingParams, Scheduler
from engine.engine_args import EngineArgs
from engine.engine_components import build_engine, load_tokenizer_for_engine
from engine.engine_loop import EngineDeadError, EngineLoop, EngineStepError
from engine.engine_stats import EngineStats, EngineStatsSnapshot
from engine.output_collector import ChildOutputSink, RequestOutputCollector
from engine.output_processor import OutputProcessor
from engine.output_processor.request_state import OutputKind
from engine.outputs import RequestOutput
from engine.parallel_sampling import ParentRequest
from engine.pooling_outputs import ClassificationRequestOutput, EmbeddingRequestOutput
from engine.pooling_requests import (CLASSIFY_ON_EMBEDDING, EMBED_ON_CLASSIFIER, EMBED_ON_GENERATE,
                                     GENERATE_ON_POOLING, POOLING_SAMPLING_PARAMS, pooling_labels,
                                     resolve_pooling_params)
from engine.request_inputs import (Prompt, check_priority, make_core_request, parse_prompt,
                                   refuse_images_in_beam_search, truncate_prompt, validate_request)

__all__ = ["AsyncLLM", "EngineDeadError", "EngineStepError"]

DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0


class AsyncLLM:
    def __init__(self, engine_args: EngineArgs | None = None, **kwargs: Any) -> None:
        """``AsyncLLM(EngineArgs(...))`` or ``AsyncLLM(model="tiny", max_num_seqs=64, ...)`` (LLM's keywords)."""
        if engine_args is None:
            engine_args = EngineArgs(**kwargs)
        elif kwargs:
            raise TypeError("pass either an EngineArgs or keyword arguments, not both")
        components = build_engine(engine_args)
        self.engine_args = engine_args
        self.model_path = components.model_path
        self.model_config = components.model_runner.model_config
        self.vocab_size = components.model_runner.vocab_size
        self.eos_token_ids = components.eos_token_ids
        # Images in prompts (engine/multimodal_inputs.py); None: a text-only model.
        self.image_inputs = components.image_inputs
        # runner="pooling": this engine embeds (embed) and refuses generate; otherwise the reverse.
        self.is_pooling = engine_args.is_pooling
        self.hidden_size = self.model_config.hidden_size
        # A sequence classifier's labels (it classifies and scores pairs instead of embedding); None otherwise.
        self.labels = pooling_labels(components.model_runner.model)
        # Read-only after construction (configuration only): safe to consult from the event loop.
        self._scheduler: Scheduler = components.scheduler
        self.tokenizer = (load_tokenizer_for_engine(components.tokenizer_path)
                          if components.tokenizer is not None else None)
        # Requests are checked (their grammars compiled) on the event loop: with this thread's tokenizer.
        components.use_grammar_tokenizer(self.tokenizer)
        self._structured_outputs = components.structured_outputs
        # The runner's LoRA state (None without enable_lora); its host cache is safe to fill from this thread.
        self._lora = components.model_runner.lora
        self.stats = EngineStats(components.scheduler)
        self._engine_loop = EngineLoop(components, OutputProcessor(components.tokenizer), self.stats)
        self._active_request_ids: set[str] = set()
        # request id -> the engine's ids for it: itself, or its n children with parallel sampling.
        self._engine_request_ids: dict[str, list[str]] = {}
        self._engine_ids_in_use: set[str] = set()  # every id of _engine_request_ids, for collision checks
        self._engine_loop.start()

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs) -> "AsyncLLM":
        return cls(engine_args)

    # ------------------------------------------------------------------ what the server needs to know

    @property
    def scheduling_policy(self) -> str:
        return self._scheduler.scheduler_config.policy

    @property
    def max_model_len(self) -> int:
        return self._scheduler.max_model_len

    @property
    def block_size(self) -> int:
        return self._scheduler.block_size

    @property
    def is_running(self) -> bool:
        return self._engine_loop.is_alive

    def get_tokenizer(self):
        return self.tokenizer

    def set_chat_template(self, chat_template: str) -> None:
        """Render conversations with ``chat_template`` (a Jinja template) instead of the tokenizer's own (vLLM's
        ``--chat-template``): the server's chat routes and /tokenize read it from the front end's tokenizer."""
        if self.tokenizer is None:
            raise ValueError("a chat template needs a tokenizer; this engine was made without one")
        self.tokenizer.chat_template = chat_template

    def get_stats(self) -> EngineStatsSnapshot:
        return self.stats.snapshot()

    def check_health(self) -> None:
        if not self._engine_loop.is_alive:
            raise self._engine_loop.dead_error or EngineDeadError("the engine thread is not running")

    # ------------------------------------------------------------------ requests

    def add_lora(self, lora_request: LoRARequest) -> None:
        """Read and check a LoRA adapter into the runner's host cache now (vLLM's ``add_lora``; the server loads
        its --lora-modules this way): a ValueError naming what is wrong, or enable_lora missing."""
        if self._lora is None:
            raise ValueError(f"LoRA adapter {lora_request.lora_name!r} needs an engine created with enable_lora=True")
        self._lora.add_lora(lora_request)

    def remove_lora(self, lora_int_id: int) -> bool:
        """Forget the adapter's name, so that a new adapter may take it under a new id (vLLM's ``remove_lora``;
        the server's unload calls it). Requests already running with the adapter finish with it, and its weights
        leave host memory when the least-recently-used order drops them. False: no adapter has this id."""
        if self._lora is None:
            return False
        return self._lora.remove_lora(lora_int_id)

    async def reset_prefix_cache(self) -> bool:
        """Forget every prefix the KV cache holds (vLLM's ``reset_prefix_cache``: a benchmark's next run starts
        cold), between two steps. False, and nothing forgotten, while a request holds blocks; the host tier of
        KV offloading keeps its blocks, as vLLM's connector does by default."""
        self.check_health()
        return await asyncio.wrap_future(self._engine_loop.reset_prefix_cache())

    def process_prompt(self, prompt: Any, sampling_params: SamplingParams,
                       lora_request: LoRARequest | None = None) -> Prompt:
        """Parse, truncate (``truncate_prompt_tokens``) and validate a prompt as ``generate`` will (ValueError
        naming what is wrong)."""
        parsed = parse_prompt("prompt", prompt, self.tokenizer, self.vocab_size, self.image_inputs)
        parsed = truncate_prompt("prompt", parsed, sampling_params, self._scheduler.max_model_len)
        validate_request("prompt", parsed, sampling_params, self._scheduler, self.vocab_size,
                         self.tokenizer is not None, self._structured_outputs, lora_request, self._lora)
        return parsed

    async def generate(self, prompt: Any, sampling_params: SamplingParams | None = None,
                       request_id: str | None = None, *,
                       output_kind: OutputKind = "delta", priority: int = 0,
                       lora_request: LoRARequest | None = None) -> AsyncIterator[RequestOutput]:
        """Stream one request's outputs. ``prompt``: text, token ids, or a dict as ``LLM.generate`` takes.
        ``priority``: lower is served first (with ``scheduling_policy="priority"``, as in vLLM).
        ``lora_request``: the LoRA adapter to run with (needs enable_lora)."""
        if self.is_pooling:
            raise ValueError(GENERATE_ON_POOLING)
        if output_kind not in ("delta", "cumulative"):
            raise ValueError(f"output_kind must be 'delta' or 'cumulative', got {output_kind!r}")
        check_priority(priority, self._scheduler.scheduler_config.policy)
        self.check_health()
        params = SamplingParams() if sampling_params is None else sampling_params
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        request_id = f"req-{uuid.uuid4().hex}" if request_id is None else request_id
        if request_id in self._active_request_ids:
            raise ValueError(f"request_id {request_id!r} is already being served")
        if isinstance(prompt, Prompt):  # already parsed (the server tokenizes first, to answer 400s)
            parsed = truncate_prompt("prompt", prompt, params, self._scheduler.max_model_len)
            validate_request("prompt", parsed, params, self._scheduler, self.vocab_size, self.tokenizer is not None,
                             self._structured_outputs, lora_request, self._lora)
        else:
            parsed = self.process_prompt(prompt, params, lora_request)
        loop = asyncio.get_running_loop()
        collector = RequestOutputCollector(loop, output_kind)
        # n > 1: n engine requests whose outputs the parent relabels into this one stream.
        parent = ParentRequest(request_id, params, output_kind) if params.n > 1 else None
        engine_requests = ([(request_id, params, collector)] if parent is None else
                           [(child_id, child_params, ChildOutputSink(parent, collector))
                            for child_id, child_params in zip(parent.child_ids, parent.child_params)])
        engine_request_ids = [engine_request_id for engine_request_id, _, _ in engine_requests]
        # A completion's id ("0_x") may be another request's own id: refused here, since the engine's refusal
        # would come with an abort of the id on the way out, ending the request that holds it.
        in_use = [engine_id for engine_id in engine_request_ids if engine_id in self._engine_ids_in_use]
        if in_use:
            raise ValueError(f"request_id {request_id!r} needs engine request id {in_use[0]!r}, which is already "
                             "being served")
        self._engine_ids_in_use.update(engine_request_ids)
        self._active_request_ids.add(request_id)
        self._engine_request_ids[request_id] = engine_request_ids
        finished = False
        try:
            # time.monotonic(): the output processor's clock, so TTFT = first_token_time - arrival_time.
            arrival_time = time.monotonic()
            for engine_request_id, engine_params, sink in engine_requests:
                request = make_core_request(engine_request_id, parsed, engine_params, self.eos_token_ids,
                                            arrival_time, priority, lora_request)
                self._engine_loop.add_request(request, parsed.text, sink)
            while not finished:
                output = await collector.get()
                finished = output.finished
                yield output
        finally:
            self._active_request_ids.discard(request_id)
            self._engine_request_ids.pop(request_id, None)
            self._engine_ids_in_use.difference_update(engine_request_ids)
            if not finished:
                # Cancelled, closed early, or failed: make sure the engine lets go of its blocks.
                self._engine_loop.abort(engine_request_ids)

    async def beam_search(self, prompt: Any, params: BeamSearchParams, request_id: str | None = None, *,
                          priority: int = 0, lora_request: LoRARequest | None = None) -> BeamSearchOutput:
        """vLLM's ``EngineClient.beam_search``, answered once at the end: the best ``params.beam_width`` sequences
        for one prompt (engine/beam_search.py). Each round runs every live beam as its own one-token request
        (``<request_id>-<round>-<beam>``), concurrently; cancelling the call aborts the round's requests."""
        if not isinstance(params, BeamSearchParams):
            raise ValueError(f"params must be a BeamSearchParams, got {type(params).__name__}")
        request_id = f"beam-{uuid.uuid4().hex}" if request_id is None else request_id
        parsed = prompt if isinstance(prompt, Prompt) else parse_prompt("prompt", prompt, self.tokenizer,
                                                                        self.vocab_size, self.image_inputs)
        refuse_images_in_beam_search("prompt", parsed)
        search = BeamSearch([parsed.token_ids], params, self.eos_token_ids)

        async def final_output(sequence: list[int], beam_request_id: str) -> RequestOutput:
            output = None
            async for output in self.generate(Prompt(None, sequence), search.round_params, beam_request_id,
                                              output_kind="cumulative", priority=priority,
                                              lora_request=lora_request):
                pass
            return output

        while sequences := search.next_round():
            tasks = [asyncio.ensure_future(final_output(sequence, f"{request_id}-{search.num_rounds}-{index}"))
                     for index, sequence in enumerate(sequences)]
            try:
                search.advance(await asyncio.gather(*tasks))
            except BaseException:
                for task in tasks:  # one failed beam request ends the round's others (cancelling aborts them)
                    task.cancel()
                raise
        decode = None if self.tokenizer is None else (
            lambda ids: self.tokenizer.decode(ids, skip_special_tokens=False))
        return search.results(decode)[0]

    def resolve_pooling_params(self, pooling_params: PoolingParams | None, label: str = "prompt") -> PoolingParams:
        """The request's pooling parameters with the engine's pooling type and defaults (ValueError naming a bad
        field, such as dimensions beyond the hidden size)."""
        if not self.is_pooling:
            raise ValueError(EMBED_ON_GENERATE)
        return resolve_pooling_params(label, pooling_params, self.engine_args.pooler_config, self.hidden_size)

    def process_pooling_prompt(self, prompt: Any, truncate_prompt_tokens: int | None = None) -> Prompt:
        """Parse and validate an embedding prompt (ValueError naming what is wrong). ``truncate_prompt_tokens``
        (vLLM's): keep only the last k tokens (-1: max_model_len), so a long input fits instead of failing."""
        parsed = parse_prompt("prompt", prompt, self.tokenizer, self.vocab_size, self.image_inputs)
        if truncate_prompt_tokens is not None:
            limit = self.max_model_len if truncate_prompt_tokens == -1 else truncate_prompt_tokens
            if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= self.max_model_len:
                raise ValueError(f"truncate_prompt_tokens must be -1 or an integer in [1, {self.max_model_len}] "
                                 f"(max_model_len), got {truncate_prompt_tokens!r}")
            if len(parsed.token_ids) > limit:
                parsed = Prompt(None, parsed.token_ids[-limit:])
        validate_request("prompt", parsed, POOLING_SAMPLING_PARAMS, self._scheduler, self.vocab_size,
                         self.tokenizer is not None)
        return parsed

    async def embed(self, prompt: Any, pooling_params: PoolingParams | None = None,
                    request_id: str | None = None) -> EmbeddingRequestOutput:
        """One prompt's embedding (vLLM's ``encode``, awaited to its one final output), on an engine created with
        ``runner="pooling"``. Cancelling the call aborts the request, which frees its blocks."""
        params = self.resolve_pooling_params(pooling_params)
        if self.labels is not None:
            raise ValueError(EMBED_ON_CLASSIFIER)
        request_id = f"embd-{uuid.uuid4().hex}" if request_id is None else request_id
        return EmbeddingRequestOutput.from_request_output(await self._pool(prompt, params, request_id))

    async def classify(self, prompt: Any, request_id: str | None = None) -> ClassificationRequestOutput:
        """One prompt's label probabilities, on a sequence classifier run with ``runner="pooling"``."""
        params = self.resolve_pooling_params(None)
        if self.labels is None:
            raise ValueError(CLASSIFY_ON_EMBEDDING)
        request_id = f"classify-{uuid.uuid4().hex}" if request_id is None else request_id
        return ClassificationRequestOutput.from_request_output(await self._pool(prompt, params, request_id))

    async def _pool(self, prompt: Any, params: PoolingParams, request_id: str) -> RequestOutput:
        """A pooling request for ``prompt``, awaited to its one final output; cancelling aborts it."""
        self.check_health()
        if request_id in self._active_request_ids or request_id in self._engine_ids_in_use:
            raise ValueError(f"request_id {request_id!r} is already being served")
        parsed = self.process_pooling_prompt(prompt.token_ids if isinstance(prompt, Prompt) else prompt)
        collector = RequestOutputCollector(asyncio.get_running_loop(), "cumulative")
        self._active_request_ids.add(request_id)
        self._engine_ids_in_use.add(request_id)
        output = None
        try:
            request = make_core_request(request_id, parsed, POOLING_SAMPLING_PARAMS, self.eos_token_ids,
                                        time.monotonic(), pooling_params=params)
            self._engine_loop.add_request(request, parsed.text, collector)
            output = await collector.get()
            while not output.finished:
                output = await collector.get()
        finally:
            self._active_request_ids.discard(request_id)
            self._engine_ids_in_use.discard(request_id)
            if output is None or not output.finished:
                self._engine_loop.abort([request_id])
        return output

    def abort(self, request_id: str | Iterable[str]) -> None:
        """Abort requests (safe from any thread); their iterators end with finish_reason "abort"."""
        request_ids = [request_id] if isinstance(request_id, str) else list(request_id)
        # A parallel-sampling request is its children in the engine (the dict is only read here: a
        # thread-safe lookup, and an id no longer served aborts nothing).
        engine_request_ids = [engine_id for rid in request_ids
                              for engine_id in self._engine_request_ids.get(rid, [rid])]
        if engine_request_ids:
            self._engine_loop.abort(engine_request_ids)

    # ------------------------------------------------------------------ shutdown

    def shutdown(self, timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S) -> None:
        """Abort every request in flight and stop the engine thread (blocks until it has stopped)."""
        self._engine_loop.request_shutdown()
        if not self._engine_loop.join(timeout):
            raise TimeoutError(f"the engine thread did not stop within {timeout} s")

    async def __aenter__(self) -> "AsyncLLM":
        return self

    async def __aexit__(self, *exc_info) -> None:
        # Joined from a worker thread: the event loop keeps running and delivers the final outputs.
        await asyncio.to_thread(self.shutdown)
