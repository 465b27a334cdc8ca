"""``python -m engine.serve``: load a model, then serve OpenAI's API on it until interrupted.

    python -m engine.serve --model tiny --port 8000
    python -m engine.serve --model /path/to/checkpoint --max-num-seqs 64 --served-model-name my-model

Engine options map one to one onto ``EngineArgs``; their defaults are ``EngineArgs``' defaults. Flags are
checked before the model loads (``engine/serve/cli_checks.py``): a bad one is a one-line ``error: ...``
naming it, with exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

import uvicorn

from engine.async_llm import AsyncLLM
from engine.engine_args import DEFAULT_MODEL, EngineArgs
from engine.engine_components import TokenizerLoadError
from engine.serve.api_keys import server_api_keys
from engine.serve.app import build_app
from engine.serve.cors import CorsSettings
from engine.reasoning_parsers import parser_names as reasoning_parser_names
from engine.serve.tool_parsers import parser_names
from engine.serve.cli_checks import (HelpFormatter, OneLineErrorParser, check_args, check_unchunked_budget,
                                     tokenizer_error_line)
from engine.serve.lora_modules import lora_requests_for

logger = logging.getLogger("engine.serve")


def make_parser() -> argparse.ArgumentParser:
    defaults = EngineArgs()
    parser = OneLineErrorParser(
        prog="python -m engine.serve", description="An OpenAI-compatible server (/v1/completions, "
        "/v1/chat/completions, /v1/responses, /v1/models, /health, /metrics) over the servesim engine.",
        formatter_class=HelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help="'tiny' or 'small' (generated locally) or a local checkpoint folder")
    parser.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the model's)")
    parser.add_argument("--served-model-name", nargs="+", default=None,
                        help="name(s) clients use in 'model' (default: the --model value)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="0-65535; 0 picks a free port")
    parser.add_argument("--api-key", nargs="+", default=None, metavar="KEY",
                        help="the /v1 routes answer only requests sending 'Authorization: Bearer KEY' with one of "
                             "these (default: the SERVESIM_API_KEY environment variable, else none: open)")
    parser.add_argument("--chat-template", default=None, metavar="FILE_OR_TEMPLATE",
                        help="a Jinja chat template, or a file holding one, used instead of the tokenizer's "
                             "(default: the tokenizer's)")
    parser.add_argument("--allowed-origins", nargs="+", default=["*"], metavar="ORIGIN",
                        help="browser origins allowed to call the server (CORS; default: any)")
    parser.add_argument("--allowed-methods", nargs="+", default=["*"], metavar="METHOD",
                        help="HTTP methods allowed from other origins (default: any)")
    parser.add_argument("--allowed-headers", nargs="+", default=["*"], metavar="HEADER",
                        help="request headers allowed from other origins (default: any)")
    parser.add_argument("--allow-credentials", action="store_true",
                        help="let cross-origin requests carry credentials (cookies, HTTP authentication)")
    parser.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                        help="server and engine log level")
    tools = parser.add_argument_group("tool calling")
    tools.add_argument("--enable-auto-tool-choice", action="store_true",
                       help='let requests use tool_choice "auto" (needs --tool-call-parser); the default '
                            "tool_choice of a request with tools is then auto, else none")
    tools.add_argument("--tool-call-parser", default=None, metavar="NAME",
                       help=f"the format the model writes tool calls in, for tool_choice auto: "
                            f"{', '.join(parser_names())} (default: none)")
    parser.add_argument("--reasoning-parser", default=None, metavar="NAME",
                        help=f"split chat answers' reasoning (<think>...</think>) from their content: "
                             f"{', '.join(reasoning_parser_names())} (default: none); structured outputs then "
                             "steer the answer after the thought")
    parser.add_argument("--structured-outputs-in-reasoning", action="store_true",
                        help="with --reasoning-parser, structured outputs steer the whole output, thought included "
                             "(vLLM's structured_outputs_config.enable_in_reasoning)")
    engine = parser.add_argument_group("engine")
    engine.add_argument("--max-num-seqs", type=int, default=defaults.max_num_seqs,
                        help="most requests running at once, >= 1")
    engine.add_argument("--max-num-batched-tokens", type=int, default=defaults.max_num_batched_tokens,
                        help="most tokens in one step, >= 1 (>= max_model_len with --no-enable-chunked-prefill)")
    engine.add_argument("--block-size", type=int, default=defaults.block_size, help="tokens per KV block, >= 1")
    engine.add_argument("--num-gpu-blocks", type=int, default=None,
                        help="KV blocks in the pool, >= 2 (default: from the memory budget)")
    engine.add_argument("--max-model-len", type=int, default=None,
                        help="longest prompt + output, >= 1 (default: the model's)")
    engine.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                        default=defaults.enable_prefix_caching, help="reuse the KV blocks of shared prefixes")
    engine.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction,
                        default=defaults.enable_chunked_prefill, help="split long prompts over several steps")
    engine.add_argument("--scheduling-policy", default=defaults.scheduling_policy,
                        help="order of admission: fcfs, priority, shortest_prompt_first, shortest_output_first, "
                             "or module:function (a rank function; lower is served first)")
    engine.add_argument("--prefix-cache-eviction-policy", default=defaults.prefix_cache_eviction_policy,
                        help="which free cached block is evicted first: lru (vLLM's), lfu, or module:Class")
    engine.add_argument("--device", default=defaults.device, help="'cpu' or 'cuda'")
    engine.add_argument("--dtype", default=defaults.dtype, help="'auto', 'float32', 'float16' or 'bfloat16'")
    engine.add_argument("--gpu-memory-utilization", type=float, default=defaults.gpu_memory_utilization,
                        help="share of device memory to use, in (0, 1]")
    engine.add_argument("--attention-backend", default=None, help="default: picked for the device")
    engine.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs for decode steps")
    engine.add_argument("--kv-offloading-size", type=float, default=defaults.kv_offloading_size_gib,
                        dest="kv_offloading_size_gib",
                        help="GiB of host memory kept as a second tier of the prefix cache (0: none)")
    engine.add_argument("--disable-hybrid-kv-cache-manager", action="store_true",
                        help="a model mixing sliding-window and full layers keeps every layer's KV in one table")
    engine.add_argument("--speculative-config", default=None,
                        help='speculative decoding as JSON, e.g. \'{"method": "ngram", "num_speculative_tokens": 3}\' '
                             "(also prompt_lookup_min, prompt_lookup_max) or "
                             '\'{"method": "draft_model", "model": "/path/to/draft", "num_speculative_tokens": 3}\' '
                             '(or "method": "eagle" or "eagle3" with an EAGLE head\'s folder); default: off')
    engine.add_argument("--runner", choices=["generate", "pooling"], default=defaults.runner,
                        help="'generate' (text: the completions and chat routes) or 'pooling' (embeddings: "
                             "/v1/embeddings), as vLLM's --runner")
    engine.add_argument("--pooler-config", "--override-pooler-config", default=None, dest="pooler_config",
                        help='with --runner pooling, how to pool, as JSON, e.g. \'{"pooling_type": "MEAN", '
                             '"normalize": true}\' (pooling_type LAST, MEAN or CLS; default LAST, normalized)')
    engine.add_argument("--seed", type=int, default=defaults.seed, help="seed of unseeded requests' sampling")
    lora = parser.add_argument_group("LoRA adapters")
    lora.add_argument("--enable-lora", action="store_true", help="serve LoRA adapters (PEFT format)")
    lora.add_argument("--lora-modules", nargs="+", default=None, metavar="NAME=PATH",
                      help="adapters to serve, each as name=path or JSON '{\"name\": ..., \"path\": ..., "
                           "\"base_model_name\": ...}'; a request whose model is the name uses the adapter (default: none)")
    lora.add_argument("--allow-runtime-lora-updating", action="store_true",
                      help="serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter, vLLM's runtime LoRA "
                           "updates (needs --enable-lora; or set SERVESIM_ALLOW_RUNTIME_LORA_UPDATING=true). Any "
                           "client can then make the server read any folder it can see")
    lora.add_argument("--max-loras", type=int, default=defaults.max_loras,
                      help="most adapters in one batch, >= 1")
    lora.add_argument("--max-lora-rank", type=int, default=defaults.max_lora_rank, help="highest adapter rank, >= 1")
    lora.add_argument("--max-cpu-loras", type=int, default=None,
                      help="adapters kept loaded in host memory, >= --max-loras (default: --max-loras)")
    return parser


def engine_args_from(args: argparse.Namespace) -> EngineArgs:
    return EngineArgs(
        model=args.model, tokenizer=args.tokenizer, dtype=args.dtype, device=args.device,
        block_size=args.block_size, enable_prefix_caching=args.enable_prefix_caching,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len, num_gpu_blocks=args.num_gpu_blocks,
        gpu_memory_utilization=args.gpu_memory_utilization, enable_chunked_prefill=args.enable_chunked_prefill,
        attention_backend=args.attention_backend, seed=args.seed, scheduling_policy=args.scheduling_policy,
        prefix_cache_eviction_policy=args.prefix_cache_eviction_policy, enforce_eager=args.enforce_eager, kv_offloading_size_gib=args.kv_offloading_size_gib,
        disable_hybrid_kv_cache_manager=args.disable_hybrid_kv_cache_manager,
        speculative_config=args.speculative_config, enable_lora=args.enable_lora, max_loras=args.max_loras,
        max_lora_rank=args.max_lora_rank, max_cpu_loras=args.max_cpu_loras, runner=args.runner,
        pooler_config=args.pooler_config, reasoning_parser=args.reasoning_parser,
        structured_outputs_in_reasoning=args.structured_outputs_in_reasoning)


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    started = time.perf_counter()
    try:
        engine_args = engine_args_from(args)  # a ValueError naming a bad --pooler-config, for one
        check_unchunked_budget(parser, args, engine_args)
        engine = AsyncLLM(engine_args)
    except TokenizerLoadError as error:
        print(f"error: {tokenizer_error_line(error, args)}", file=sys.stderr)
        return 2
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    names = args.served_model_name or [args.model]
    try:  # every adapter is read and checked now: a bad one stops the server before it listens
        lora_requests = lora_requests_for(args.lora_modules or [], names)
        for lora_request in lora_requests.values():
            try:
                engine.add_lora(lora_request)
            except ValueError as error:
                raise ValueError(f"--lora-modules {lora_request.lora_name}: {error}") from None
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        engine.shutdown()
        return 2
    stats = engine.get_stats()
    logger.info("loaded %s in %.1f s: max_model_len %d, %d KV blocks of %d tokens; serving it as %s",
                engine.model_path, time.perf_counter() - started, engine.max_model_len,
                stats.kv_cache_usable_blocks, engine.block_size, ", ".join(names))
    if lora_requests:
        logger.info("serving LoRA adapters %s", ", ".join(f"{name} ({request.lora_path})"
                                                         for name, request in lora_requests.items()))
    app = build_app(engine, names, shutdown_engine=True, on_shutdown=lambda: _print_summary(engine),
                    tool_parser=args.tool_call_parser if args.enable_auto_tool_choice else None,
                    reasoning_parser=args.reasoning_parser,
                    lora_requests=lora_requests, lora_parents={module.name: module.base_model_name
                                                               for module in args.lora_modules or []
                                                               if module.base_model_name},
                    # The flag turns the routes on; without it the environment variable decides.
                    allow_runtime_lora_updating=True if args.allow_runtime_lora_updating else None,
                    api_keys=server_api_keys(args.api_key), chat_template=args.chat_template,
                    cors=CorsSettings(args.allowed_origins, args.allowed_methods, args.allowed_headers,
                                      args.allow_credentials))
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=5)
    return 0


def _print_summary(engine) -> None:
    stats = engine.get_stats()
    by_reason = ", ".join(f"{reason} {count}" for reason, count in stats.finished_requests.items() if count)
    print(f"served {sum(stats.finished_requests.values())} requests ({by_reason or 'none'}), "
          f"{stats.generation_tokens} tokens generated in {stats.num_steps} engine steps", file=sys.stderr)
