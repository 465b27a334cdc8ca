"""The checks ``python -m engine.serve`` makes on its flags before it loads a model.

Each failure is one line naming the flag and its value (``error: --max-num-seqs must be >= 1, got 0``)
with exit status 2, as for argparse's own usage errors. Without these, a bad value surfaces later as a
message about something else (a KV budget, numpy's "negative dimensions", a bind() traceback), or only
after the model has loaded.
"""

from __future__ import annotations

import argparse
import socket
from pathlib import Path
from typing import NoReturn

from engine.core.sampling_params import MAX_SEED, MIN_SEED
from engine.core.eviction_policies import check_eviction_policy
from engine.core.scheduling_policy import policy_rank
from engine.engine_args import DEFAULT_MODEL_NAMES, EngineArgs
from engine.engine_components import TokenizerLoadError
from engine.models.config import ModelConfig
from engine.reasoning_parsers import parser_names as reasoning_parser_names
from engine.serve.tool_parsers import parser_names

# dest -> (lowest, highest) accepted; None: unbounded. The engine's own limits, spelled as the CLI's flags.
INTEGER_RANGES: dict[str, tuple[int | None, int | None]] = {
    "port": (0, 65535),
    "max_num_seqs": (1, None),
    "max_num_batched_tokens": (1, None),
    "block_size": (1, None),
    "num_gpu_blocks": (2, None),  # block 0 is the null block
    "max_model_len": (1, None),
    "seed": (MIN_SEED, MAX_SEED),  # what torch.manual_seed accepts
    "max_loras": (1, None),
    "max_lora_rank": (1, None),
    "max_cpu_loras": (1, None),
}


class OneLineErrorParser(argparse.ArgumentParser):
    """Usage errors as one ``error: ...`` line (the usage is a screenful; --help shows it), exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message}\n")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Adds "(default: ...)" only where the help does not already say what the default is."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.help and "default" in action.help:
            return action.help
        return super()._get_help_string(action)


def flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exit through ``parser.error`` on the first flag the engine or the server would fail on."""
    for dest, (lowest, highest) in INTEGER_RANGES.items():
        value = getattr(args, dest)
        if value is None:
            continue
        if highest is None and value < lowest:
            parser.error(f"{flag(dest)} must be >= {lowest}, got {value}")
        if highest is not None and not lowest <= value <= highest:
            parser.error(f"{flag(dest)} must be in [{lowest}, {highest}], got {value}")
    if not 0.0 < args.gpu_memory_utilization <= 1.0:
        parser.error(f"--gpu-memory-utilization must be in (0, 1], got {args.gpu_memory_utilization}")
    if not 0.0 <= args.kv_offloading_size_gib < float("inf"):
        parser.error(f"--kv-offloading-size must be a number of GiB >= 0, got {args.kv_offloading_size_gib}")
    if args.kv_offloading_size_gib and not args.enable_prefix_caching:
        parser.error("--kv-offloading-size needs prefix caching (leave out --no-enable-prefix-caching)")
    try:
        policy_rank(args.scheduling_policy)
    except ValueError as error:
        parser.error(f"--scheduling-policy must be {error}, got {args.scheduling_policy!r}")
    try:
        check_eviction_policy(args.prefix_cache_eviction_policy)
    except ValueError as error:
        parser.error(f"--prefix-cache-eviction-policy must be {error}, got {args.prefix_cache_eviction_policy!r}")
    if args.chat_template is not None:
        from engine.chat_template import load_chat_template
        try:
            args.chat_template = load_chat_template(args.chat_template)
        except ValueError as error:
            parser.error(f"--chat-template: {error}")
    if args.api_key is not None and not all(args.api_key):
        parser.error("--api-key: a key must not be empty")
    if args.speculative_config is not None:
        from engine.runner.spec_decode.config import SpeculativeConfig
        try:
            args.speculative_config = SpeculativeConfig.parse(args.speculative_config)
        except ValueError as error:
            parser.error(f"--speculative-config: {error}")
    if args.enable_auto_tool_choice and args.tool_call_parser is None:
        parser.error("--enable-auto-tool-choice needs --tool-call-parser NAME (the format the model writes calls "
                     f"in: {', '.join(parser_names())})")
    if args.reasoning_parser is not None and args.reasoning_parser not in reasoning_parser_names():
        parser.error(f"--reasoning-parser {args.reasoning_parser!r} is not a known parser; known: "
                     f"{', '.join(reasoning_parser_names())}")
    if args.tool_call_parser is not None and args.tool_call_parser not in parser_names():
        parser.error(f"--tool-call-parser {args.tool_call_parser!r} is not a known parser; known: "
                     f"{', '.join(parser_names())}")
    check_lora_flags(parser, args)
    try:
        socket.getaddrinfo(args.host, args.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        parser.error(f"--host {args.host!r} is not an address to listen on ({error.strerror})")
    if args.tokenizer is not None and args.tokenizer not in DEFAULT_MODEL_NAMES and not Path(args.tokenizer).is_dir():
        parser.error(f"--tokenizer {args.tokenizer!r} is not a folder; give the folder holding the tokenizer's "
                     "files, or leave --tokenizer out to use the model's")


def check_lora_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--lora-modules entries parsed into LoRAModulePaths (args.lora_modules); they and
    --allow-runtime-lora-updating need --enable-lora."""
    from engine.serve.lora_modules import parse_lora_module

    if args.max_cpu_loras is not None and args.max_cpu_loras < args.max_loras:
        parser.error(f"--max-cpu-loras must be >= --max-loras ({args.max_loras}), got {args.max_cpu_loras}")
    if args.allow_runtime_lora_updating and not args.enable_lora:
        parser.error("--allow-runtime-lora-updating needs --enable-lora")
    if not args.lora_modules:
        return
    if not args.enable_lora:
        parser.error("--lora-modules needs --enable-lora")
    modules = []
    for text in args.lora_modules:
        try:
            modules.append(parse_lora_module(text))
        except ValueError as error:
            parser.error(f"--lora-modules: {error}")
    args.lora_modules = modules


def check_unchunked_budget(parser: argparse.ArgumentParser, args: argparse.Namespace,
                           engine_args: EngineArgs) -> None:
    """Without chunked prefill a prompt is scheduled in one step, so the per-step token budget must hold
    the longest one. The engine would silently lower max_model_len to the budget; the server refuses the
    combination instead, as vLLM and ``sim.run`` do, so /v1/models never reports a limit nobody asked for."""
    if args.enable_chunked_prefill:
        return
    if args.max_model_len is not None:
        max_model_len, source = args.max_model_len, "--max-model-len"
    else:
        max_model_len = ModelConfig.from_pretrained(engine_args.resolve_model_path()).max_model_len_limit
        source = "the model's"
    if args.max_num_batched_tokens < max_model_len:
        parser.error(f"--max-num-batched-tokens must be >= max_model_len ({max_model_len}, {source}) with "
                     f"--no-enable-chunked-prefill, got {args.max_num_batched_tokens}: a longer prompt could "
                     "never be scheduled in one step; raise --max-num-batched-tokens or lower --max-model-len")


def tokenizer_error_line(error: TokenizerLoadError, args: argparse.Namespace) -> str:
    """The engine's tokenizer error reworded for the CLI: the flag to use, not the Python keywords."""
    given_by = "--tokenizer" if args.tokenizer is not None else "the --model folder; name another with --tokenizer"
    has_files = any((Path(error.path) / name).is_file()
                    for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"))
    reason = " ".join(error.reason.split()) if has_files else \
        "no tokenizer.json, tokenizer_config.json or tokenizer.model there"
    return f"cannot load a tokenizer from {str(error.path)!r} ({given_by}): {reason}"
