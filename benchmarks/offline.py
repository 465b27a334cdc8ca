"""Offline throughput: our engine (continuous batching, paged KV) vs transformers' static batches.

    python -m benchmarks.offline [--num-requests 256] [--device cpu] [--model small] [--json]
    python -m benchmarks.offline --device cuda --max-num-seqs 1 --no-baseline --cuda-graphs on|off

One seeded workload of mixed prompt and output lengths (ignore_eos, fixed output lengths, greedy) runs
through ``engine.LLM`` and through ``transformers``' batched ``generate`` on the same checkpoint, in one
process with one torch thread. The baseline cuts the requests, in order, into static batches of
``--hf-batch-size``, left-pads each batch to its longest prompt and generates its longest output length
for every row; only the tokens each request asked for count as useful output. The gap between the two
is what continuous batching buys: no padding, and a finished request's slot is refilled at once.

Each figure comes with its ceiling: the achieved model FLOP/s (2 x parameters per processed token,
prompt and output, attention excluded) against what a plain matmul of the model's shape reaches on
this machine.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import dataclass

import torch

DEFAULT_MODEL = "small"


@dataclass(frozen=True)
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def num_output_tokens(self) -> int:
        return sum(self.output_lens)

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)


def make_workload(num_requests: int, vocab_size: int, seed: int = 0, min_prompt: int = 16, max_prompt: int = 512,
                  min_output: int = 16, max_output: int = 256) -> Workload:
    """Log-uniform prompt and output lengths: many short requests, a tail of long ones."""
    rng = random.Random(seed)

    def log_uniform(low: int, high: int) -> int:
        return int(round(low * (high / low) ** rng.random()))

    prompts, output_lens = [], []
    for _ in range(num_requests):
        # Ids from 4 up: 0..3 are the generated tokenizer's special tokens.
        prompts.append([rng.randrange(4, vocab_size) for _ in range(log_uniform(min_prompt, max_prompt))])
        output_lens.append(log_uniform(min_output, max_output))
    return Workload(prompts, output_lens)


def run_engine(model_path, workload: Workload, device: str, max_num_seqs: int, *, dtype: str = "auto",
               enforce_eager: bool = False) -> tuple[float, list[list[int]], bool]:
    """Seconds, every request's output tokens, and whether decode steps replayed CUDA graphs."""
    from engine import LLM, SamplingParams

    longest = max(len(p) + n for p, n in zip(workload.prompts, workload.output_lens))
    bytes_per_token = _kv_bytes_per_token(model_path)
    # Room for every request at full length: the comparison is about batching, not about preemption.
    kv_bytes = bytes_per_token * (workload.num_prompt_tokens + workload.num_output_tokens + 64 * len(workload.prompts))
    llm = LLM(model=str(model_path), device=device, dtype=dtype, max_num_seqs=max_num_seqs,
              max_model_len=longest + 16, kv_cache_memory_bytes=int(kv_bytes), skip_tokenizer_init=True,
              enforce_eager=enforce_eager)
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in workload.output_lens]
    llm.generate(workload.prompts[:4], params[:4], use_tqdm=False)  # warm-up
    started = time.perf_counter()
    outputs = llm.generate(workload.prompts, params, use_tqdm=sys.stderr.isatty())
    if device == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - started
    return elapsed, [o.outputs[0].token_ids for o in outputs], llm.model_runner.decode_graphs is not None


def run_transformers(model_path, workload: Workload, device: str, batch_size: int) -> tuple[float, int]:
    """Seconds and generated rows x steps (padding included) for static left-padded batches."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32, attn_implementation="sdpa")
    model.to(device).eval()
    pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0

    def generate(prompts: list[list[int]], max_new_tokens: int) -> None:
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt):] = torch.tensor(prompt)
            attention_mask[row, width - len(prompt):] = 1
        with torch.inference_mode():
            model.generate(input_ids.to(device), attention_mask=attention_mask.to(device), do_sample=False,
                           max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, pad_token_id=pad_id)

    generate(workload.prompts[:4], 4)  # warm-up
    started = time.perf_counter()
    num_padded_outputs = 0
    batches = range(0, len(workload.prompts), batch_size)
    for index, start in enumerate(batches):
        prompts = workload.prompts[start:start + batch_size]
        max_new_tokens = max(workload.output_lens[start:start + batch_size])
        generate(prompts, max_new_tokens)
        num_padded_outputs += len(prompts) * max_new_tokens
        print(f"  transformers batch {index + 1}/{len(batches)} done ({time.perf_counter() - started:.1f} s)",
              file=sys.stderr)
    return time.perf_counter() - started, num_padded_outputs


def _kv_bytes_per_token(model_path) -> int:
    from engine.models.config import ModelConfig

    config = ModelConfig.from_pretrained(model_path)
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 4


def _model_flops_per_token(model_path) -> float:
    """2 x the parameters a token passes through (every layer and the LM head; not the embedding lookup)."""
    from engine.models.config import ModelConfig

    c = ModelConfig.from_pretrained(model_path)
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    per_layer = c.hidden_size * (q + 2 * kv) + q * c.hidden_size + 3 * c.hidden_size * c.intermediate_size
    return 2.0 * (c.num_hidden_layers * per_layer + c.hidden_size * c.vocab_size)


def matmul_ceiling_flops(model_path, device: str, rows: int = 256) -> float:
    """FLOP/s of the model's largest matmul shape at a large batch: what a perfect runner could reach."""
    from engine.models.config import ModelConfig

    c = ModelConfig.from_pretrained(model_path)
    a = torch.randn(rows, c.hidden_size, device=device)
    b = torch.randn(c.hidden_size, 2 * c.intermediate_size, device=device)
    for _ in range(3):
        a @ b
    repeats = 20
    started = time.perf_counter()
    for _ in range(repeats):
        a @ b
    if device == "cuda":
        torch.cuda.synchronize()
    return 2.0 * rows * c.hidden_size * 2 * c.intermediate_size * repeats / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-requests", type=int, default=256, help="requests in the workload (default 256)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help="'tiny', 'small' (generated defaults) or a checkpoint folder (default small)")
    parser.add_argument("--hf-batch-size", type=int, default=32, help="static batch size of the baseline")
    parser.add_argument("--max-num-seqs", type=int, default=256, help="the engine's max_num_seqs")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="auto", help="the engine's dtype (auto: the checkpoint's)")
    parser.add_argument("--cuda-graphs", choices=["on", "off"], default="on",
                        help="on (default): decode steps replay CUDA graphs where the device and attention "
                             "backend allow; off: every step eager (vLLM's enforce_eager)")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip transformers; report the engine alone (e.g. to compare --cuda-graphs on/off)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the summary")
    args = parser.parse_args(argv)
    if args.num_requests < 1:
        parser.error(f"--num-requests must be >= 1, got {args.num_requests}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: this machine has no CUDA device (torch.cuda.is_available() is False)")
    torch.set_num_threads(args.threads)

    from engine.engine_args import EngineArgs
    from engine.models.config import ModelConfig

    model_path = EngineArgs(model=args.model).resolve_model_path()
    vocab_size = ModelConfig.from_pretrained(model_path).vocab_size
    workload = make_workload(args.num_requests, vocab_size, args.seed)
    print(f"workload: {args.num_requests} requests, {workload.num_prompt_tokens} prompt + "
          f"{workload.num_output_tokens} output tokens, model {model_path.name}, device {args.device}, "
          f"{args.threads} thread(s)", file=sys.stderr)

    print("running the engine ...", file=sys.stderr)
    engine_s, engine_outputs, graphs_used = run_engine(model_path, workload, args.device, args.max_num_seqs,
                                                       dtype=args.dtype, enforce_eager=args.cuda_graphs == "off")
    produced = sum(len(tokens) for tokens in engine_outputs)
    if produced != workload.num_output_tokens:
        raise RuntimeError(f"the engine produced {produced} tokens, the workload asked for {workload.num_output_tokens}")
    engine_tps = workload.num_output_tokens / engine_s
    if args.no_baseline:
        result = {"engine_tokens_per_s": engine_tps, "engine_seconds": engine_s, "cuda_graphs": graphs_used,
                  "num_requests": args.num_requests, "num_output_tokens": workload.num_output_tokens,
                  "max_num_seqs": args.max_num_seqs, "device": args.device}
        print(json.dumps(result) if args.json else
              f"engine: {engine_tps:8.1f} output tokens/s ({engine_s:.2f} s; CUDA graphs "
              f"{'used' if graphs_used else 'not used'})")
        return 0
    print(f"running transformers (static batches of {args.hf_batch_size}) ...", file=sys.stderr)
    hf_s, hf_padded_outputs = run_transformers(model_path, workload, args.device, args.hf_batch_size)

    hf_tps = workload.num_output_tokens / hf_s
    flops_per_token = _model_flops_per_token(model_path)
    processed = workload.num_prompt_tokens + workload.num_output_tokens
    ceiling = matmul_ceiling_flops(model_path, args.device)
    result = {
        "engine_tokens_per_s": engine_tps,
        "hf_tokens_per_s": hf_tps,
        "ratio": engine_tps / hf_tps,
        "cuda_graphs": graphs_used,
        "num_requests": args.num_requests,
        "num_prompt_tokens": workload.num_prompt_tokens,
        "num_output_tokens": workload.num_output_tokens,
        "engine_seconds": engine_s,
        "hf_seconds": hf_s,
        "hf_padded_output_tokens": hf_padded_outputs,
        "engine_model_gflops": processed * flops_per_token / engine_s / 1e9,
        "hf_useful_model_gflops": processed * flops_per_token / hf_s / 1e9,
        "matmul_ceiling_gflops": ceiling / 1e9,
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"engine:       {engine_tps:8.1f} output tokens/s  ({engine_s:.1f} s, "
          f"{result['engine_model_gflops']:.1f} GFLOP/s of model work)")
    print(f"transformers: {hf_tps:8.1f} output tokens/s  ({hf_s:.1f} s, {result['hf_useful_model_gflops']:.1f} "
          f"GFLOP/s of useful work; {hf_padded_outputs} output slots for {workload.num_output_tokens} useful)")
    print(f"ratio:        {result['ratio']:.2f}x   (matmul ceiling on this machine: "
          f"{result['matmul_ceiling_gflops']:.1f} GFLOP/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
