"""Shared by the image model tests: a small workload whose images come at the sizes a test gives, recorded on a
checkpoint's real engine."""

from __future__ import annotations


def image_workload(name: str, seed: int, tokens_per_image: dict, num_requests: int = 10, distinct: int = 4):
    from workloads import load_workload

    return load_workload({
        "name": name, "seed": seed, "model": "tiny", "hardware": "cpu", "dtype": "float32",
        "engine": {"block_size": 8, "num_gpu_blocks": 64, "max_num_seqs": 6, "max_num_batched_tokens": 24,
                   "max_model_len": 256},
        "workload": {"num_requests": num_requests, "arrival": {"type": "poisson", "rate": 200},
                     "prompt_len": {"type": "uniform", "min": 4, "max": 30},
                     "output_len": {"type": "uniform", "min": 2, "max": 10},
                     "images": {"fraction": 0.8, "distinct": distinct, "tokens_per_image": tokens_per_image}}})


def record(spec, checkpoint, out):
    """``spec`` run for real on ``checkpoint`` into ``out``; the engine is returned."""
    from sim.real_engine import build_real_engine
    from sim.real_run import run_real

    real = build_real_engine(spec, model=str(checkpoint), threads=1)
    run_real(spec, out, real.engine, vocab_size=real.vocab_size, reserved_token_ids=real.reserved_token_ids,
             executor_info=real.info, images=real.images)
    return real
