"""Multi-LoRA serving's cost: the same greedy requests with no adapter, with one, and with two, side by side.

    python -m benchmarks.lora [--model small] [--num-requests 8] [--max-tokens 64] [--rank 8] [--repeats 3]

One process, one torch thread, alternating the cases, the median of ``--repeats`` each. Cases: an engine
without LoRA; the same engine with ``enable_lora`` but base-model requests only (should cost nothing: such a
step does no LoRA work); every request on one adapter; half on each of two adapters (both in one batch,
``max_loras=2``). Adapters are generated (``engine.models.make_lora``: all seven projections, ``--rank``).
Columns: output tokens per second, the ratio to the engine without LoRA, and the median decode step time.
The extra work is ``2 * rank * (in + out)`` flops per token per projection (times the slices of a fused
one: q/k/v and gate/up are packed into one pair of matmuls), a few percent of the base matmuls at rank 8 and
hidden 512; each adapter's rows also cost an index_select and an index_add, and on the CPU the small matmuls
weigh more than their flops.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small", help="a generated default model name or a checkpoint folder")
    parser.add_argument("--num-requests", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    import torch

    from engine import LLM, SamplingParams
    from engine.core import LoRARequest
    from engine.engine_args import EngineArgs
    from engine.models.make_lora import make_lora_adapter

    torch.set_num_threads(1)
    model_path = EngineArgs(model=args.model).resolve_model_path()
    folder = Path(tempfile.mkdtemp(prefix="lora-bench-"))
    adapters = [LoRARequest(f"adapter{index}", index + 1,
                            str(make_lora_adapter(folder / f"adapter{index}", model_path, rank=args.rank,
                                                  alpha=2 * args.rank, seed=index)))
                for index in range(2)]
    rng = random.Random(0)
    prompts = [[rng.randrange(10, 4000) for _ in range(args.prompt_len)] for _ in range(args.num_requests)]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    engine_options = dict(model=str(model_path), max_num_seqs=args.num_requests, enable_prefix_caching=False)
    plain = LLM(**engine_options)
    with_lora = LLM(**engine_options, enable_lora=True, max_loras=2, max_lora_rank=max(16, args.rank))
    half = args.num_requests // 2
    cases = {
        "no LoRA": (plain, None),
        "enable_lora, base requests": (with_lora, None),
        "one adapter": (with_lora, adapters[0]),
        "two adapters": (with_lora, [adapters[0]] * half + [adapters[1]] * (args.num_requests - half)),
    }
    rates: dict[str, list[float]] = {name: [] for name in cases}
    step_times: dict[str, list[float]] = {name: [] for name in cases}
    print(f"{args.num_requests} requests x {args.prompt_len} prompt + {args.max_tokens} output tokens, "
          f"{model_path.name}, rank {args.rank}, {args.repeats} repeats", file=sys.stderr)
    for repeat in range(args.repeats + 1):  # the first round warms up and is not counted
        for name, (llm, lora_request) in cases.items():
            runner = llm.model_runner
            durations: list[float] = []
            original = runner.execute_model

            def timed(scheduler_output, original=original, durations=durations, runner=runner):
                output = original(scheduler_output)
                if scheduler_output.total_num_scheduled_tokens == len(scheduler_output.num_scheduled_tokens):
                    durations.append(runner.last_step_duration_s)  # decode-only steps
                return output

            runner.execute_model = timed
            started = time.perf_counter()
            outputs = llm.generate(prompts, params, use_tqdm=False, lora_request=lora_request)
            elapsed = time.perf_counter() - started
            runner.execute_model = original
            if repeat:
                rates[name].append(sum(len(o.outputs[0].token_ids) for o in outputs) / elapsed)
                step_times[name].append(statistics.median(durations))
    baseline = statistics.median(rates["no LoRA"])
    print(f"{'case':<28} {'tokens/s':>9} {'ratio':>6} {'decode step ms':>15}")
    for name in cases:
        rate = statistics.median(rates[name])
        print(f"{name:<28} {rate:9.1f} {rate / baseline:6.2f} {1000 * statistics.median(step_times[name]):15.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
