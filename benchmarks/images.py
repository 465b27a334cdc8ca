"""Offline throughput with images: our engine against transformers' static batches, and what repeated images save.

    python -m benchmarks.images [--model small-llava] [--num-requests 64] [--pool 8] [--device cpu] [--json]

One seeded workload (benchmarks/offline.py's mixed lengths, greedy, fixed output lengths), every prompt showing one
image after its first token, runs three ways in one process with one torch thread:
- the engine, every image new (each encoded once);
- the engine, images drawn from a pool of ``--pool`` pictures: a picture shown again is encoded once while the
  encoder cache keeps it, and the same picture after the same first token is a prefix-cache hit past the image;
- transformers' ``LlavaForConditionalGeneration.generate`` on the same checkpoint and the new images, in static
  left-padded batches of ``--hf-batch-size`` (each batch generates its longest output for every row; only the tokens
  each request asked for count).
The figures are output tokens per second and their ratios; the engine's runs also report the images it encoded.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch

from benchmarks.offline import make_workload


def pictures(count: int, size: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(count)]


def run_engine(model_path, prompts, images, output_lens, device: str) -> tuple[float, int]:
    """Seconds for the workload and the images the engine encoded."""
    from engine import LLM, SamplingParams

    longest = max(len(prompt) for prompt in prompts) + max(output_lens)
    llm = LLM(model=str(model_path), device=device, dtype="float32", max_model_len=longest + 64,
              skip_tokenizer_init=True, max_num_seqs=64)
    tokens_per_image = llm.image_inputs.tokens_per_image
    requests = [{"prompt_token_ids": prompt, "multi_modal_data": {"image": image}}
                for prompt, image in zip(prompts, images)]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in output_lens]
    warm_up = pictures(2, llm.image_inputs.image_size, seed=99)
    llm.generate([{"prompt_token_ids": prompts[0], "multi_modal_data": {"image": picture}} for picture in warm_up],
                 params[:2], use_tqdm=False)
    llm.llm_engine.scheduler.reset_prefix_cache()
    encoded_before = llm.model_runner.encoder_outputs.num_items_encoded
    started = time.perf_counter()
    outputs = llm.generate(requests, params, use_tqdm=sys.stderr.isatty())
    if device == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - started
    produced = sum(len(output.outputs[0].token_ids) for output in outputs)
    if produced != sum(output_lens) or any(output.prompt_token_ids.count(prompts[0][1]) < tokens_per_image
                                           for output in outputs):
        raise RuntimeError("the engine did not run the workload as asked")
    return elapsed, llm.model_runner.encoder_outputs.num_items_encoded - encoded_before


def run_transformers(model_path, prompts, images, output_lens, device: str, batch_size: int, tokens_per_image: int,
                     image_token: int) -> float:
    from transformers import AutoImageProcessor, LlavaForConditionalGeneration

    model = LlavaForConditionalGeneration.from_pretrained(str(model_path), dtype=torch.float32,
                                                          attn_implementation="sdpa").to(device).eval()
    processor = AutoImageProcessor.from_pretrained(str(model_path))

    def generate(batch_prompts, batch_images, max_new_tokens: int) -> None:
        expanded = [[token for token_id in prompt for token in
                     ([token_id] * tokens_per_image if token_id == image_token else [token_id])]
                    for prompt in batch_prompts]
        width = max(len(prompt) for prompt in expanded)
        input_ids = torch.zeros((len(expanded), width), dtype=torch.long)
        attention_mask = torch.zeros((len(expanded), width), dtype=torch.long)
        for row, prompt in enumerate(expanded):
            input_ids[row, width - len(prompt):] = torch.tensor(prompt)
            attention_mask[row, width - len(prompt):] = 1
        pixel_values = processor(images=batch_images, return_tensors="pt")["pixel_values"]
        with torch.inference_mode():
            model.generate(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                           pixel_values=pixel_values.to(device), do_sample=False, max_new_tokens=max_new_tokens,
                           min_new_tokens=max_new_tokens, pad_token_id=0)

    generate(prompts[:2], images[:2], 4)  # warm-up
    started = time.perf_counter()
    for start in range(0, len(prompts), batch_size):
        generate(prompts[start:start + batch_size], images[start:start + batch_size],
                 max(output_lens[start:start + batch_size]))
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="small-llava", help="'tiny-llava', 'small-llava' or a LLaVA folder")
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--pool", type=int, default=8, help="pictures the repeated-image run draws from (default 8)")
    parser.add_argument("--hf-batch-size", type=int, default=16, help="static batch size of the baseline")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-baseline", action="store_true", help="skip transformers")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the summary")
    args = parser.parse_args(argv)
    if args.num_requests < 2 or args.pool < 1:
        parser.error("--num-requests must be >= 2 and --pool >= 1")
    torch.set_num_threads(args.threads)

    from engine.engine_args import EngineArgs
    from engine.models.vision import load_image_encoder

    model_path = EngineArgs(model=args.model).resolve_model_path()
    encoder = load_image_encoder(model_path, torch.float32, torch.device("cpu"))
    if encoder is None:
        parser.error(f"--model {args.model}: not a checkpoint whose images the engine encodes (LLaVA)")
    vocab_size = encoder.image_token_id + 1
    workload = make_workload(args.num_requests, vocab_size - 1, args.seed, max_prompt=256, max_output=128)
    prompts = [prompt[:1] + [encoder.image_token_id] + prompt[1:] for prompt in workload.prompts]
    new = pictures(args.num_requests, encoder.image_size, args.seed)
    pool = pictures(args.pool, encoder.image_size, args.seed + 1)
    rng = np.random.default_rng(args.seed + 2)
    repeated = [pool[index] for index in rng.integers(0, args.pool, args.num_requests)]
    output_tokens = workload.num_output_tokens

    print(f"{args.num_requests} requests, one image each ({encoder.tokens_per_image} tokens), {output_tokens} "
          f"output tokens, model {model_path.name}, {args.device}", file=sys.stderr)
    new_s, new_encoded = run_engine(model_path, prompts, new, workload.output_lens, args.device)
    pool_s, pool_encoded = run_engine(model_path, prompts, repeated, workload.output_lens, args.device)
    result = {"num_requests": args.num_requests, "tokens_per_image": encoder.tokens_per_image,
              "engine_new_images_tokens_per_s": output_tokens / new_s, "engine_new_images_encoded": new_encoded,
              "engine_pool_tokens_per_s": output_tokens / pool_s, "engine_pool_encoded": pool_encoded,
              "pool": args.pool, "pool_speedup": new_s / pool_s}
    if not args.no_baseline:
        hf_s = run_transformers(model_path, prompts, new, workload.output_lens, args.device, args.hf_batch_size,
                                encoder.tokens_per_image, encoder.image_token_id)
        result.update(transformers_tokens_per_s=output_tokens / hf_s, engine_over_transformers=hf_s / new_s)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"engine, every image new:      {result['engine_new_images_tokens_per_s']:8.1f} output tokens/s "
          f"({new_encoded} images encoded)")
    print(f"engine, pool of {args.pool} pictures:   {result['engine_pool_tokens_per_s']:8.1f} output tokens/s "
          f"({pool_encoded} images encoded; {result['pool_speedup']:.2f}x)")
    if not args.no_baseline:
        print(f"transformers, batches of {args.hf_batch_size}: {result['transformers_tokens_per_s']:8.1f} output "
              f"tokens/s (the engine, new images: {result['engine_over_transformers']:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
