"""Building an engine from ``EngineArgs``: the setup shared by ``LLM`` and ``AsyncLLM``.

Both front ends need the same pieces, built in the same order: the tokenizer (unless skipped), the
model runner and its KV cache sized from the memory budget, the real executor, the scheduler sized
from what the runner resolved (``max_model_len``, the number of blocks), and the EOS ids the core and
the stop checks use. The front ends differ only in how they drive ``EngineCore.step()``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.core import EngineCore, Scheduler
from engine.engine_args import EngineArgs
from engine.models import load_tokenizer
from engine.multimodal_inputs import ImageInputs
from engine.runner.executor import RealExecutor
from engine.runner.model_runner import ModelRunner
from engine.runner.structured_output import StructuredOutputs

logger = logging.getLogger(__name__)


@dataclass
class EngineComponents:
    engine_args: EngineArgs
    model_path: Path
    tokenizer_path: Path | None  # None with skip_tokenizer_init
    tokenizer: Any
    model_runner: ModelRunner
    executor: RealExecutor
    engine_core: EngineCore
    eos_token_ids: list[int]
    # Images in prompts (engine/multimodal_inputs.py), for a checkpoint whose image encoder the runner loaded;
    # None: text only.
    image_inputs: ImageInputs | None = None

    @property
    def scheduler(self) -> Scheduler:
        return self.engine_core.scheduler

    @property
    def structured_outputs(self) -> StructuredOutputs:
        return self.model_runner.structured_outputs

    def use_grammar_tokenizer(self, tokenizer) -> None:
        """Give the engine's grammars ``tokenizer`` to read the vocabulary from: a front end that checks requests
        on another thread than the engine's (AsyncLLM) passes its own instance, since a Hugging Face tokenizer
        must not be used from two threads at once. Call before the engine starts stepping."""
        args = self.engine_args
        tags = None
        if args.reasoning_parser is not None and not args.structured_outputs_in_reasoning and tokenizer is not None:
            from engine.reasoning_parsers import get_parser

            parser = get_parser(args.reasoning_parser)
            tags = tuple(tokenizer.encode(tag, add_special_tokens=False) for tag in (parser.start_tag, parser.end_tag))
        self.model_runner.structured_outputs = StructuredOutputs(tokenizer, self.model_runner.vocab_size,
                                                                 self.eos_token_ids, tags)


class TokenizerLoadError(ValueError):
    """No tokenizer could be loaded from ``path``; ``reason`` is the loader's own message. A ValueError whose
    text advises the Python API's keywords; front ends with other spellings (the CLI's flags) reword it."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"cannot load a tokenizer from {str(path)!r} ({reason}); pass "
                         "tokenizer=<folder> or skip_tokenizer_init=True to use token-id prompts")
        self.path = path
        self.reason = reason


def load_tokenizer_for_engine(tokenizer_path: Path | None):
    """The tokenizer at ``tokenizer_path`` (None: none), with an error that says what to do instead."""
    if tokenizer_path is None:
        return None
    try:
        return load_tokenizer(tokenizer_path)
    except (OSError, ValueError) as error:
        raise TokenizerLoadError(tokenizer_path, str(error)) from error


def build_engine(args: EngineArgs) -> EngineComponents:
    model_path = args.resolve_model_path()
    tokenizer_path = args.resolve_tokenizer_path(model_path)
    tokenizer = load_tokenizer_for_engine(tokenizer_path)
    args.check_kv_offloading()
    runner = ModelRunner(args.create_runner_config(model_path), tokenizer=tokenizer)
    model_config = runner.model.config
    grouping = args.kv_cache_grouping(model_config.layer_kv_spans)
    num_gpu_blocks = runner.determine_num_gpu_blocks(args.max_num_batched_tokens, grouping)
    num_offload_blocks = runner.determine_num_offload_blocks(args.kv_offloading_size_gib)
    if args.kv_offloading_size_gib and num_offload_blocks < 1:
        raise ValueError(f"kv_offloading_size_gib={args.kv_offloading_size_gib!r} holds no block of the model's KV")
    runner.initialize_kv_cache(num_gpu_blocks, num_offload_blocks, grouping)
    executor = RealExecutor(runner)
    # Every layer windowed: the core hands back the blocks that leave each request's window; windowed and full
    # layers mixed: vLLM's hybrid KV cache (one table per group of layers, the windowed ones handing blocks
    # back; Llama 4's chunked layers likewise), unless turned off, when every block is kept for every layer. The
    # share of windowed (or chunked) layers prices a step's attention in the trace (sim/cost_models/step_batch.py).
    image_inputs, tokens_per_image = image_inputs_of(model_path, runner)
    images_whole = image_inputs is not None and image_inputs.encoder.bidirectional_image_attention
    scheduler = Scheduler(args.create_scheduler_config(runner.max_model_len, tokens_per_image, images_whole),
                          args.create_cache_config(num_gpu_blocks, num_offload_blocks, model_config.sliding_window,
                                                   model_config.sliding_window_fraction, grouping,
                                                   model_config.attention_chunk))
    warn_if_max_model_len_lowered(scheduler)
    components = EngineComponents(
        engine_args=args, model_path=model_path, tokenizer_path=tokenizer_path, tokenizer=tokenizer,
        model_runner=runner, executor=executor, engine_core=EngineCore(scheduler, executor),
        eos_token_ids=eos_token_ids(runner.model_config, tokenizer),
        image_inputs=image_inputs)
    # Grammars are masked over the model's vocabulary (its logits' width) and end at the engine's EOS ids.
    components.use_grammar_tokenizer(tokenizer)
    return components


def image_inputs_of(model_path: Path, runner: ModelRunner) -> tuple[ImageInputs | None, int]:
    """The engine's image inputs and the most placeholder tokens of one image (the encoder budget's floor); (None, 0)
    for a text model, or for a vision-language checkpoint whose images cannot be prepared (no preprocessor_config.json:
    its text is served, images refused, and the log says why)."""
    if runner.encoder_outputs is None:
        return None, 0
    image_inputs = ImageInputs(model_path, runner.encoder_outputs.encoder)
    try:
        return image_inputs, image_inputs.max_tokens_per_image
    except ValueError as error:
        logger.warning("%s; images are refused, text is served", error)
        return None, 0


def warn_if_max_model_len_lowered(scheduler: Scheduler) -> None:
    """Say so when the KV pool (or, without chunked prefill, the step budget) holds fewer tokens than
    max_model_len: the engine then refuses longer prompts (``SchedulerConfig.effective_max_model_len``),
    and a user who set max_model_len expects it to hold unless told. vLLM refuses such a configuration
    outright; the shared core keeps serving shorter requests, because simulated what-ifs with small pools
    rely on that."""
    configured, effective = scheduler.scheduler_config.max_model_len, scheduler.max_model_len
    if effective < configured:
        cache = scheduler.cache_config
        logger.warning("the engine serves sequences of up to %d tokens, not max_model_len=%d: the KV cache holds "
                       "%d tokens (%d usable blocks of %d)%s; "
                       "raise the KV budget (kv_cache_memory_bytes, gpu_memory_utilization or num_gpu_blocks) to "
                       "serve longer sequences", effective, configured, cache.capacity_tokens,
                       cache.num_usable_blocks, cache.block_size,
                       "" if scheduler.scheduler_config.enable_chunked_prefill else
                       f" or the step budget without chunked prefill is {scheduler.scheduler_config.max_num_batched_tokens}")


def eos_token_ids(model_config, tokenizer) -> list[int]:
    """The checkpoint's EOS id(s): config.json's, else the tokenizer's."""
    eos = model_config.eos_token_id
    if eos is None and tokenizer is not None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return []
    return [eos] if isinstance(eos, int) else list(eos)
