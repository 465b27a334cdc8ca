"""Simulator speed: simulated requests per wall-clock second, end to end.

    python -m benchmarks.sim_speed [--json] [--num-requests N] [--replicas R]

The workload is the one Vidur's published speed figure uses, so the two compare directly: 10,000
requests with prompt and output lengths from the Azure conversation trace (splitwise_conv), Poisson
arrivals at 4 requests/s, a Llama-2-7B shape on an A100-80GB preset, at most 128 sequences and 4,096
tokens per step, 16-token blocks. Wall time covers the workload generation, the simulation and writing
every output (parquet traces and summary.json), as Vidur's figure does. Vidur: about 625 requests/s end
to end (about 935 in its event loop alone) on this class of machine.

``--replicas R`` simulates a cluster of R such engines behind vLLM's least-loaded router, with the
arrival rate scaled by R so that each replica sees about the same load (Vidur's cluster runs scale so).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

from sim.engine_setup import build_setup
from sim.run_pipeline import simulate, summarize
from analysis import write_run
from workloads import example_path, load_workload
from workloads.cluster_section import MAX_REPLICAS

VIDUR_REQUESTS_PER_S = 625.0


def workload_config(num_requests: int, replicas: int = 1):
    return load_workload({
        "name": "sim-speed",
        "seed": 0,
        "model": "llama-2-7b",
        "hardware": "a100-80gb",
        "dtype": "float16",
        "engine": {"block_size": 16, "max_num_seqs": 128, "max_num_batched_tokens": 4096,
                   "max_model_len": 4096, "enable_prefix_caching": True},
        "cluster": {"num_replicas": replicas},
        "workload": {
            "num_requests": num_requests,
            "arrival": {"type": "poisson", "rate": 4.0 * replicas},
            "prompt_len": {"type": "trace"},
            "output_len": {"type": "trace"},
            "trace": {"path": str(example_path("conversation_trace").parent.parent / "data"
                                  / "splitwise_conv_sample.csv"), "format": "csv",
                      "sample": "sequential"},
        },
    })


def measure(num_requests: int, replicas: int = 1) -> dict:
    started = time.perf_counter()
    setup = build_setup(workload_config(num_requests, replicas))
    generated = time.perf_counter()
    recorder = simulate(setup)
    simulated = time.perf_counter()
    requests, steps, summary = summarize(recorder, setup)
    with tempfile.TemporaryDirectory() as out_dir:
        write_run(out_dir, requests, steps, summary)
    finished = time.perf_counter()
    wall = finished - started
    return {"num_requests": num_requests, "replicas": replicas, "wall_s": wall, "requests_per_s": num_requests / wall,
            "generate_s": generated - started, "event_loop_s": simulated - generated,
            "event_loop_requests_per_s": num_requests / (simulated - generated),
            "write_s": finished - simulated, "num_steps": len(recorder.steps["step"]),
            "simulated_duration_s": summary["duration_s"]}


def replica_count(text: str) -> int:
    value = int(text) if text.strip().lstrip("-").isdigit() else None
    if value is None or not 1 <= value <= MAX_REPLICAS:
        raise argparse.ArgumentTypeError(f"must be an integer in 1..{MAX_REPLICAS}, got {text}")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--num-requests", type=int, default=10_000)
    parser.add_argument("--replicas", type=replica_count, default=1,
                        help=f"a cluster of this many engines, 1..{MAX_REPLICAS} (rate scaled)")
    args = parser.parse_args()
    result = measure(args.num_requests, args.replicas)
    if args.json:
        print(json.dumps({key: result[key] for key in ("num_requests", "replicas", "wall_s", "requests_per_s")}))
        return
    cluster = f" on {args.replicas} replicas" if args.replicas > 1 else ""
    print(f"simulated {result['num_requests']:,} requests{cluster} ({result['num_steps']:,} engine steps, "
          f"{result['simulated_duration_s']:,.0f} s of virtual time) in {result['wall_s']:.2f} s wall-clock")
    print(f"  end to end: {result['requests_per_s']:,.0f} requests/s  "
          f"(Vidur: ~{VIDUR_REQUESTS_PER_S:.0f}; ratio {result['requests_per_s'] / VIDUR_REQUESTS_PER_S:.1f}x)")
    print(f"  event loop: {result['event_loop_requests_per_s']:,.0f} requests/s; generate {result['generate_s']:.2f} s, "
          f"simulate {result['event_loop_s']:.2f} s, summarize+write {result['write_s']:.2f} s")


if __name__ == "__main__":
    main()
