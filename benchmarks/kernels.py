"""Kernel speed against its ceiling: reshape_and_cache vs copy bandwidth, Triton decode vs flash-attn.

    python -m benchmarks.kernels [--json] [--runs N] [--quick] [--save PATH]

Needs CUDA; on a machine without it, it says so and exits 0.

What is measured (medians of ``--runs`` timed runs after warm-up, each timed with CUDA events, with
the L2 cache flushed before every run so that no kernel is served from a warm cache):

* copy: ``dst.copy_(src)`` of 1 GiB, bytes moved = 2 x size. This is the device's practical bandwidth
  ceiling, measured the same way as everything else.
* reshape_and_cache (Triton, CUDA): Llama-3-8B's KV shape (8 kv heads x 128), bfloat16 (and an fp8
  cache), slots in shuffled blocks. Bytes moved = keys and values read + written + slot_mapping.
  Target: >= 80% of copy bandwidth at large token counts.
* paged decode: one query token per request over a paged cache, 32 query / 8 kv heads x 128, bfloat16,
  Triton ``triton_paged_attention`` vs FlashAttention-2 on the same inputs: flash-attn's
  ``flash_attn_with_kvcache`` with a block table when flash-attn is installed, else PyTorch's bundled
  FlashAttention-2 (see ``flash_decode_baseline``). flash-attn 2.x reads a paged cache only with blocks that are a multiple of 256
  tokens, so both read 256-token blocks; Triton at vLLM's usual 16-token blocks is reported beside it.
  Bandwidth = K and V bytes read. Target: Triton within 1.3x of flash-attn's time.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable

import torch

DEVICE = "cuda"  # a module constant so that a CPU dry run (interpreter, tiny shapes) can swap it
KV_HEADS, HEAD_SIZE, QUERY_HEADS = 8, 128, 32
FLASH_ATTN_PAGE = 256
TARGET_COPY_FRACTION = 0.80
TARGET_DECODE_RATIO = 1.30


class Timer:
    """Median microseconds of a callable, CUDA-event timed, L2 flushed before each run."""

    def __init__(self, runs: int, warmup: int) -> None:
        self.runs, self.warmup = runs, warmup
        # Larger than any current GPU's L2 (H100/H200: 50-60 MiB), so zeroing it evicts everything.
        self._flush = torch.empty(256 * 2 ** 20, dtype=torch.uint8, device=DEVICE)

    def __call__(self, fn: Callable[[], object]) -> float:
        for _ in range(self.warmup):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(self.runs):
            self._flush.zero_()
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        return statistics.median(times)

    def replayed(self, fn: Callable[[], object]) -> float | None:
        """Median microseconds of ``fn`` captured once in a CUDA graph and replayed: the device's time
        alone, without the host's launch overhead (how the engine runs decode steps). None when ``fn``
        cannot be captured."""
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    fn()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
        except RuntimeError as error:
            print(f"capture failed: {error}".splitlines()[0], file=sys.stderr)
            return None
        return self(graph.replay)


def measure_copy(timer: Timer) -> dict:
    source = torch.empty(2 ** 30, dtype=torch.uint8, device=DEVICE).random_(0, 255)
    target = torch.empty_like(source)
    microseconds = timer(lambda: target.copy_(source))
    bytes_moved = 2 * source.numel()
    return {"kernel": "copy", "case": "1 GiB", "us": microseconds, "gb_per_s": bytes_moved / microseconds / 1e3}


def reshape_and_cache_kernels() -> dict[str, Callable | str]:
    """name -> kernel, or name -> why it is unavailable."""
    kernels: dict[str, Callable | str] = {}
    try:
        from kernels.triton_reshape_and_cache import triton_reshape_and_cache
        kernels["triton"] = triton_reshape_and_cache
    except ImportError as error:
        kernels["triton"] = f"triton unavailable: {error}"
    try:
        from kernels.cuda_reshape_and_cache import cuda_reshape_and_cache, load_extension
        load_extension()
        kernels["cuda"] = cuda_reshape_and_cache
    except RuntimeError as error:
        kernels["cuda"] = f"CUDA kernel unavailable: {error}"
    return kernels


def measure_reshape_and_cache(timer: Timer, token_counts: list[int], kernels: dict) -> list[dict]:
    rows = []
    cases = [(tokens, torch.bfloat16) for tokens in token_counts] + [(token_counts[-1], torch.float8_e4m3fn)]
    for num_tokens, cache_dtype in cases:
        block_size = 16
        num_blocks = 2 * num_tokens // block_size + 1
        key = torch.randn(num_tokens, KV_HEADS, HEAD_SIZE, device=DEVICE, dtype=torch.bfloat16)
        value = torch.randn_like(key)
        key_cache = torch.zeros(num_blocks, block_size, KV_HEADS, HEAD_SIZE, device=DEVICE, dtype=cache_dtype)
        value_cache = torch.zeros_like(key_cache)
        # Whole blocks in shuffled order, as a step's requests own them; half the cache stays unused.
        blocks = torch.randperm(num_blocks, device=DEVICE)[: -(-num_tokens // block_size)]
        slot_mapping = (blocks[:, None] * block_size + torch.arange(block_size, device=DEVICE)).flatten()[:num_tokens]
        elements = 2 * num_tokens * KV_HEADS * HEAD_SIZE
        bytes_moved = elements * (key.element_size() + key_cache.element_size()) + slot_mapping.numel() * 8
        dtype_name = "fp8" if cache_dtype == torch.float8_e4m3fn else "bf16"
        for name, kernel in kernels.items():
            case = f"{num_tokens} tokens, {dtype_name} cache"
            if isinstance(kernel, str):
                rows.append({"kernel": f"reshape_and_cache/{name}", "case": case, "skipped": kernel})
                continue
            microseconds = timer(lambda: kernel(key, value, key_cache, value_cache, slot_mapping, 1.0, 1.0))
            rows.append({"kernel": f"reshape_and_cache/{name}", "case": case, "tokens": num_tokens,
                         "cache_dtype": dtype_name, "us": microseconds, "gb_per_s": bytes_moved / microseconds / 1e3})
    return rows


def _decode_inputs(batch: int, context: int, block_size: int, generator: torch.Generator) -> dict:
    blocks_per_seq = -(-context // block_size)
    num_blocks = batch * blocks_per_seq
    shape = (num_blocks, block_size, KV_HEADS, HEAD_SIZE)
    key_cache = torch.randn(shape, device=DEVICE, dtype=torch.bfloat16, generator=generator)
    value_cache = torch.randn(shape, device=DEVICE, dtype=torch.bfloat16, generator=generator)
    permutation = torch.randperm(num_blocks, device=DEVICE, generator=generator)
    return {
        "query": torch.randn(batch, QUERY_HEADS, HEAD_SIZE, device=DEVICE, dtype=torch.bfloat16, generator=generator),
        "key_cache": key_cache, "value_cache": value_cache,
        "block_table": permutation.view(batch, blocks_per_seq).to(torch.int32),
        "seq_lens": torch.full((batch,), context, dtype=torch.int32, device=DEVICE),
        "query_start_loc": torch.arange(batch + 1, dtype=torch.int32, device=DEVICE),
    }


def _triton_decode(inputs: dict, output: torch.Tensor, scale: float, num_kv_splits: int | None = None) -> None:
    from kernels.triton_paged_attention import triton_paged_attention
    triton_paged_attention(inputs["query"], inputs["key_cache"], inputs["value_cache"], output,
                           inputs["query_start_loc"], inputs["seq_lens"], inputs["block_table"], scale, 1,
                           num_kv_splits=num_kv_splits)


# Split-KV counts timed for every decode case beside the default choice: which one is fastest per batch
# size is what tuning ``_default_num_kv_splits`` needs, and a GPU is lent rarely, so one run gathers it.
SWEPT_KV_SPLITS = (1, 2, 4, 8, 16)


def _cumulative(lengths: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(lengths.shape[0] + 1, dtype=torch.int32, device=lengths.device)
    out[1:] = torch.cumsum(lengths, 0)
    return out


def flash_decode_baseline(inputs: dict, scale: float) -> tuple[Callable[[], torch.Tensor], str]:
    """FlashAttention-2 decode on ``inputs``: a callable returning [batch, heads, head_size], and its name.

    flash-attn's ``flash_attn_with_kvcache`` when the package is installed. Otherwise PyTorch's bundled
    copy of the same FlashAttention-2 kernels (``aten::_flash_attention_forward``, varlen): through the
    block table when this torch's op takes one, else on the cache gathered contiguous beforehand (then
    it reads no block table at all, which can only make the baseline faster).
    """
    query, key_cache, value_cache = inputs["query"], inputs["key_cache"], inputs["value_cache"]
    seq_lens, block_table = inputs["seq_lens"], inputs["block_table"]
    try:
        from flash_attn import flash_attn_with_kvcache

        return (lambda: flash_attn_with_kvcache(query[:, None], key_cache, value_cache, cache_seqlens=seq_lens,
                                                block_table=block_table, softmax_scale=scale, causal=True)[:, 0],
                "flash-attn flash_attn_with_kvcache")
    except ImportError:
        pass
    flash = torch.ops.aten._flash_attention_forward
    cu_q, cu_k = inputs["query_start_loc"], _cumulative(seq_lens)
    max_k = int(seq_lens.max())
    if "block_table" in str(flash.default._schema):
        def paged():
            return flash(query, key_cache, value_cache, cu_q, cu_k, 1, max_k, 0.0, True, False, scale=scale,
                         block_table=block_table)[0]
        try:
            paged()
            return paged, "torch-bundled FlashAttention-2 (paged)"
        except RuntimeError as error:  # e.g. a page size its build does not accept
            print(f"torch's paged FlashAttention-2 refused these inputs ({error}); using contiguous K/V",
                  file=sys.stderr)
    block_size = key_cache.shape[1]
    position = torch.arange(max_k, device=DEVICE)
    slots = (block_table.long()[:, position // block_size] * block_size + position % block_size).flatten()
    keys = key_cache.flatten(0, 1)[slots].contiguous()
    values = value_cache.flatten(0, 1)[slots].contiguous()
    return (lambda: flash(query, keys, values, cu_q, cu_k, 1, max_k, 0.0, True, False, scale=scale)[0],
            "torch-bundled FlashAttention-2 (contiguous K/V)")


def measure_paged_decode(timer: Timer, batches: list[int], contexts: list[int]) -> list[dict]:
    import kernels.triton_paged_attention  # noqa: F401  (raises ImportError here when triton is missing)

    scale = 1 / math.sqrt(HEAD_SIZE)
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    rows = []
    for context in contexts:
        for batch in batches:
            case = f"batch {batch}, context {context}"
            kv_bytes = 2 * batch * context * KV_HEADS * HEAD_SIZE * 2
            # Both block sizes hold the same keys' worth of cache; only one set lives at a time.
            for block_size in (FLASH_ATTN_PAGE, 16):
                inputs = _decode_inputs(batch, context, block_size, generator)
                output = torch.empty_like(inputs["query"])
                triton_us = timer(lambda: _triton_decode(inputs, output, scale))
                row = {"kernel": "paged_decode/triton", "case": case, "block_size": block_size, "us": triton_us,
                       "gb_per_s": kv_bytes / triton_us / 1e3,
                       "graph_us": timer.replayed(lambda: _triton_decode(inputs, output, scale))}
                if block_size == FLASH_ATTN_PAGE:
                    by_split = {splits: timer(lambda: _triton_decode(inputs, output, scale, splits))
                                for splits in SWEPT_KV_SPLITS}
                    best = min(by_split, key=by_split.get)
                    row.update(us_by_kv_split=by_split, best_kv_split=best, best_kv_split_us=by_split[best])
                    try:
                        flash_decode, flash_name = flash_decode_baseline(inputs, scale)
                        flash_us = timer(flash_decode)
                        flash_graph_us = timer.replayed(flash_decode)
                        if row["graph_us"] and flash_graph_us:
                            row.update(flash_attn_graph_us=flash_graph_us,
                                       graph_ratio_vs_flash_attn=row["graph_us"] / flash_graph_us)
                        _triton_decode(inputs, output, scale)
                        row.update(flash_attn_us=flash_us, ratio_vs_flash_attn=triton_us / flash_us,
                                   flash_baseline=flash_name,
                                   max_abs_diff_vs_flash_attn=float((flash_decode().float() - output.float())
                                                                    .abs().max()))
                    except Exception as error:  # noqa: BLE001  (a benchmark row says why, the run goes on)
                        row["flash_attn"] = f"no FlashAttention-2 baseline: {error}".splitlines()[0][:200]
                rows.append(row)
                inputs = output = None
                torch.cuda.empty_cache()
    return rows


def print_table(results: dict) -> None:
    copy_bandwidth = results["copy"]["gb_per_s"]
    print(f"device: {results['device']}   copy bandwidth (ceiling): {copy_bandwidth:.0f} GB/s")
    print(f"{'kernel':<26} {'case':<30} {'block':>5} {'us':>10} {'GB/s':>8} {'% copy':>7} {'flash us':>9} {'ratio':>6}"
          f" {'graph us':>9} {'flash':>7} {'ratio':>6}")
    notes = []
    for row in [results["copy"], *results["reshape_and_cache"], *results["paged_decode"]]:
        for reason in (row.get("skipped"), row.get("flash_attn")):
            if reason and reason not in notes:
                notes.append(reason)
        if "skipped" in row:
            print(f"{row['kernel']:<26} {row['case']:<30} skipped [{notes.index(row['skipped']) + 1}]")
            continue
        flash = f"{row['flash_attn_us']:>9.1f} {row['ratio_vs_flash_attn']:>6.2f}" if "flash_attn_us" in row else ""
        if "flash_attn" in row:
            flash = f"{'n/a [' + str(notes.index(row['flash_attn']) + 1) + ']':>9}"
        graph = f" {row['graph_us']:>9.1f}" if row.get("graph_us") else ""
        if "graph_ratio_vs_flash_attn" in row:
            graph += f" {row['flash_attn_graph_us']:>7.1f} {row['graph_ratio_vs_flash_attn']:>6.2f}"
        if graph and not flash:
            flash = " " * 16
        print(f"{row['kernel']:<26} {row['case']:<30} {row.get('block_size', ''):>5} {row['us']:>10.1f} "
              f"{row['gb_per_s']:>8.0f} {100 * row['gb_per_s'] / copy_bandwidth:>6.0f}% {flash}{graph}")
    for number, note in enumerate(notes, 1):
        print(f"[{number}] {note}")
    for row in results["paged_decode"]:
        if "us_by_kv_split" in row:
            timings = ", ".join(f"{splits}: {us:.1f}" for splits, us in row["us_by_kv_split"].items())
            print(f"triton decode {row['case']}, us by split-KV count ({timings}): best {row['best_kv_split']}, "
                  f"default {row['us']:.1f} us")
    baselines = sorted({row["flash_baseline"] for row in results["paged_decode"] if "flash_baseline" in row})
    if baselines:
        print(f"flash us / ratio: against {', '.join(baselines)}")
    for line in verdicts(results):
        print(line)


def verdicts(results: dict) -> list[str]:
    """One line per target: the figure it is judged on, and whether it is met."""
    lines, copy_bandwidth = [], results["copy"]["gb_per_s"]
    largest = max((row["tokens"] for row in results["reshape_and_cache"] if "tokens" in row), default=None)
    for row in results["reshape_and_cache"]:
        if row.get("tokens") == largest and row.get("cache_dtype") == "bf16":
            fraction = row["gb_per_s"] / copy_bandwidth
            met = "met" if fraction >= TARGET_COPY_FRACTION else "NOT met"
            lines.append(f"target {row['kernel']} >= {TARGET_COPY_FRACTION:.0%} of copy at {largest} tokens: "
                         f"{fraction:.0%} ({met})")
    ratios = [row["ratio_vs_flash_attn"] for row in results["paged_decode"] if "ratio_vs_flash_attn" in row]
    if ratios:
        worst = max(ratios)
        met = "met" if worst <= TARGET_DECODE_RATIO else "NOT met"
        lines.append(f"target triton decode <= {TARGET_DECODE_RATIO}x flash-attn (eager calls, host launch "
                     f"included): worst {worst:.2f}x, median {statistics.median(ratios):.2f}x ({met})")
        tuned = [row["best_kv_split_us"] / row["flash_attn_us"] for row in results["paged_decode"]
                 if "best_kv_split_us" in row and "flash_attn_us" in row]
        if tuned:
            met = "met" if max(tuned) <= TARGET_DECODE_RATIO else "NOT met"
            lines.append(f"  with the fastest split-KV count per case instead of the default: worst {max(tuned):.2f}x "
                         f"({met})")
        graph_ratios = [row["graph_ratio_vs_flash_attn"] for row in results["paged_decode"]
                        if "graph_ratio_vs_flash_attn" in row]
        if graph_ratios:
            worst = max(graph_ratios)
            met = "met" if worst <= TARGET_DECODE_RATIO else "NOT met"
            lines.append(f"target triton decode <= {TARGET_DECODE_RATIO}x flash-attn (graph replay, device time "
                         f"only): worst {worst:.2f}x, median {statistics.median(graph_ratios):.2f}x ({met})")
    else:
        lines.append("target triton decode vs flash-attn: not measured (flash-attn unavailable)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--runs", type=int, default=50, help="timed runs per case; the median is reported")
    parser.add_argument("--warmup", type=int, default=10, help="untimed runs before timing each case")
    parser.add_argument("--quick", action="store_true", help="fewer sizes (used by benchmarks/gpu_check.sh)")
    parser.add_argument("--save", metavar="PATH", help="also write the JSON object to PATH")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks.kernels needs CUDA (torch.cuda.is_available() is False): nothing measured.")
        return 0
    timer = Timer(args.runs, args.warmup)
    token_counts = [256, 4096, 65536] if args.quick else [256, 1024, 4096, 16384, 65536]
    batches = [1, 16, 128] if args.quick else [1, 4, 16, 64, 128]
    contexts = [4096] if args.quick else [1024, 4096]
    print("measuring copy bandwidth, reshape_and_cache, paged decode ...", file=sys.stderr)
    def save() -> None:
        # After every part, not only at the end: a run stopped by its time limit (gpu_check.sh's budget)
        # still leaves what it measured.
        if args.save:
            with open(args.save, "w") as file:
                json.dump(results, file, indent=1)

    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "runs": args.runs,
               "copy": measure_copy(timer)}
    save()
    results["reshape_and_cache"] = measure_reshape_and_cache(timer, token_counts, reshape_and_cache_kernels())
    save()
    try:
        results["paged_decode"] = measure_paged_decode(timer, batches, contexts)
    except ImportError as error:
        results["paged_decode"] = [{"kernel": "paged_decode/triton", "case": "all", "skipped": str(error)}]
    results["verdicts"] = verdicts(results)
    save()
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
