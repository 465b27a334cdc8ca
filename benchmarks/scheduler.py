"""Scheduler overhead: ``schedule()`` + ``update_from_output()`` per step with many running decodes.

    python -m benchmarks.scheduler [--json] [--steps N]

Setup (fixed by the issue so figures compare across versions and with vLLM's scheduler): 32-token
prompts, 16-token blocks, prefix caching on, every request decoding one fake token per step. The
executor is not timed: only the two scheduler calls are, as vLLM's own scheduler benchmark does.
The figure to compare is microseconds per request per step (vLLM 0.33 needs about 11 on this class
of machine).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import time

from engine.core import CacheConfig, ModelRunnerOutput, Request, SamplingParams, Scheduler, SchedulerConfig

PROMPT_LEN = 32
BLOCK_SIZE = 16


def measure(num_requests: int, num_steps: int, seed: int = 0) -> dict:
    rng = random.Random(seed)
    max_tokens = num_steps + 64
    blocks_per_request = -(-(PROMPT_LEN + max_tokens) // BLOCK_SIZE)
    scheduler = Scheduler(
        SchedulerConfig(max_num_seqs=num_requests, max_num_batched_tokens=max(8192, num_requests * PROMPT_LEN),
                        max_model_len=PROMPT_LEN + max_tokens + 16),
        CacheConfig(block_size=BLOCK_SIZE, num_gpu_blocks=num_requests * blocks_per_request + 16,
                    enable_prefix_caching=True))
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    for index in range(num_requests):
        prompt = [rng.randrange(32000) for _ in range(PROMPT_LEN)]
        scheduler.add_request(Request(f"req-{index}", prompt, params, eos_token_id=2))

    def one_step() -> tuple[float, int]:
        started = time.perf_counter()
        scheduler_output = scheduler.schedule()
        middle = time.perf_counter()
        # The fake model output is built outside the timed region: it is the executor's work.
        req_ids = list(scheduler_output.num_scheduled_tokens)
        output = ModelRunnerOutput(req_ids, {rid: i for i, rid in enumerate(req_ids)}, [[7]] * len(req_ids))
        resumed = time.perf_counter()
        scheduler.update_from_output(scheduler_output, output)
        ended = time.perf_counter()
        return (middle - started) + (ended - resumed), len(req_ids)

    one_step()  # the prefill step: all prompts at once
    for _ in range(5):
        one_step()
    gc.collect()
    gc.disable()  # a collection pause would land on a random step; the median is what is reported
    try:
        timings = []
        for _ in range(num_steps):
            elapsed, scheduled = one_step()
            assert scheduled == num_requests, "every request must decode in every timed step"
            timings.append(elapsed)
    finally:
        gc.enable()
    median = statistics.median(timings)
    return {"num_requests": num_requests, "us_per_step": median * 1e6,
            "us_per_request_step": median * 1e6 / num_requests}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON list instead of a table")
    parser.add_argument("--steps", type=int, default=200, help="timed decode steps per size (default 200)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024])
    args = parser.parse_args()
    results = [measure(size, args.steps) for size in args.sizes]
    if args.json:
        print(json.dumps(results))
        return
    print(f"{'running decodes':>16} {'us/step':>10} {'us/request/step':>16}")
    for row in results:
        print(f"{row['num_requests']:>16} {row['us_per_step']:>10.1f} {row['us_per_request_step']:>16.2f}")
    print("target: <= 2.0 us/request/step at 256 requests (vLLM 0.33: about 11)")


if __name__ == "__main__":
    main()
