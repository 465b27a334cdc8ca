"""The simulator's decode fast-forward changes nothing but speed: traces are identical without it."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from analysis import requests_table, steps_table
from engine.core import EngineCore, Scheduler
from sim.engine_setup import build_setup
from sim.sim_executor import SimulatedExecutor
from sim.simulator import Simulation
from workloads import example_path, load_workload


def traces(workload, fast_forward):
    setup = build_setup(workload)
    engine = EngineCore(Scheduler(setup.scheduler_config, setup.cache_config), SimulatedExecutor(setup.cost_model))
    simulation = Simulation(engine, setup.requests, fast_forward=fast_forward, host_link=setup.host_link)
    recorder = simulation.run()
    manager = engine.scheduler.kv_cache_manager
    final_pool = ([b.block_id for b in manager.block_pool.free_block_queue],
                  manager.block_pool.cached_block_hash_to_block.block_ids(),
                  manager.offload.hashes() if manager.offload is not None else None)
    return (requests_table(recorder.request_columns()).to_pandas(), steps_table(recorder.step_columns()).to_pandas(),
            final_pool, simulation.num_fast_forwarded_steps)


@pytest.mark.parametrize("name, overrides", [
    ("chat", ["workload.num_requests=250"]),
    ("chat", ["workload.num_requests=250", "engine.num_gpu_blocks=160", "engine.max_model_len=2048",
              "workload.arrival.rate=30"]),                      # preemption
    ("chat", ["workload.num_requests=80", "workload.n=3", "engine.num_gpu_blocks=160", "engine.max_model_len=2048",
              "workload.arrival.rate=10"]),                      # completions sampling tokens of their own
    ("mooncake", ["workload.num_requests=60", "workload.trace.sample=random_with_replacement",
                  "workload.arrival={type: poisson, rate: 2}", "engine.num_gpu_blocks=2500"]),  # repeated prompts too
    ("chat", ["workload.num_requests=200", "engine.block_size=1", "workload.arrival.rate=3"]),
    ("priority", ["workload.num_requests=200"]),
    ("code_trace", ["workload.num_requests=150", "engine.enable_prefix_caching=false"]),
    ("kv_offloading", ["workload.num_requests=200", "sweep=null", "engine.kv_offloading_size_gib=4"]),  # host tier
    ("kv_offloading", ["workload.num_requests=200", "sweep=null", "engine.kv_offloading_size_gib=16"]),
    ("moe", ["workload.num_requests=150", "sweep=null"]),  # a mixture of experts: the step time is not linear
    # Sliding windows: blocks handed back as they leave each request's window (Mistral-7B-v0.1's 4096 keys)
    ("sliding_window", ["workload.num_requests=120", "sweep=null"]),
    ("sliding_window", ["workload.num_requests=120", "sweep=null", "engine.enable_prefix_caching=false"]),
    ("chat", ["workload.num_requests=200", "model=MISTRAL_WINDOW_200"]),  # windows end in shared system prompts
    # Windowed and full layers (22 of 26) in one table (without the hybrid KV cache, which takes ordinary steps):
    # every block kept, decode reads the mean over layers
    ("chat", ["workload.num_requests=200", "model=gemma-3-1b", "engine.disable_hybrid_kv_cache_manager=true"]),
    # The same with vLLM's hybrid KV cache: seven groups each allocating, the local ones handing blocks back
    ("chat", ["workload.num_requests=200", "model=gemma-3-1b"]),
    ("hybrid_kv_cache", ["workload.num_requests=60", "sweep=null"]),
    ("hybrid_kv_cache", ["workload.num_requests=60", "sweep=null", "engine.enable_prefix_caching=false"]),
    # Images: encoder steps between the decodes, outputs kept and evicted (a small cache), prefix hits over images
    ("multimodal", ["workload.num_requests=150", "sweep=null", "workload.images.distinct=20",
                    "engine.encoder_cache_size=3000"]),
    ("multimodal", ["workload.num_requests=120", "sweep=null", "model=gemma-3-4b", "workload.images.tokens_per_image=null"]),
    # Eviction by LFU: the fast-forward allocates from the empty blocks only, ahead of the policy's cached ones
    ("prefix_cache_eviction", ["sweep=null", "workload.duration_s=60", "workload.classes[0].duration_s=60",
                               "engine.num_gpu_blocks=3000", "engine.prefix_cache_eviction_policy=lfu"]),
    ("chat", ["workload.num_requests=300", "engine.num_gpu_blocks=1500", "engine.prefix_cache_eviction_policy=lfu"]),
])
def test_traces_are_identical_with_and_without_fast_forward(name, overrides, tmp_path):
    overrides = [override.replace("MISTRAL_WINDOW_200", windowed_mistral(tmp_path, 200)) for override in overrides]
    workload = load_workload(example_path(name), overrides=overrides)
    requests_on, steps_on, pool_on, fast_forwarded = traces(workload, True)
    requests_off, steps_off, pool_off, none = traces(workload, False)
    assert none == 0 and fast_forwarded > 0
    pd.testing.assert_frame_equal(requests_on, requests_off, check_exact=True)
    pd.testing.assert_frame_equal(steps_on, steps_off, check_exact=True)
    assert pool_on == pool_off


def windowed_mistral(directory, window: int) -> str:
    """Mistral-7B's shape with every layer attending its last ``window`` keys: a config.json the simulator reads."""
    path = directory / f"mistral-window-{window}.json"
    path.write_text(json.dumps({
        "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336, "num_hidden_layers": 32, "vocab_size": 32000,
        "max_position_embeddings": 32768, "sliding_window": window}))
    return str(path)
