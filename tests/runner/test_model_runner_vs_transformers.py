"""Every logits row the runner computes equals transformers' logits at that position (fp32, 1e-4).

The runner is driven by the real scheduler (chunked prefill, prefix caching, a small pool that forces
preemption), and ``compute_logits`` is wrapped to record what it returns. Each row belongs to one
request's last scheduled token, so it must equal transformers' logits for the full final sequence at
that position: prefill logits, logits after a prefix-cache hit, after chunks, and after recomputation.
"""

import pytest
import torch

from engine.core.kv_cache_grouping import group_layers
from engine.core import CacheConfig, EngineCore, Request, SamplingParams, Scheduler, SchedulerConfig
from engine.runner.config import RunnerConfig
from engine.runner.executor import RealExecutor
from tests.engine.model_fixtures import hf_logits, load_hf_model, mixed_prompts

ATOL = 1e-4


def make_engine(path, num_gpu_blocks, max_num_batched_tokens=64, max_num_seqs=8, prefix_caching=True, hybrid=False):
    """The engine as build_engine assembles it: the model's windows in the cache config (blocks handed back when
    every layer slides), and with ``hybrid`` vLLM's hybrid KV cache for a model mixing windowed and full layers."""
    executor = RealExecutor.from_config(RunnerConfig(model=path, max_num_seqs=max_num_seqs,
                                                     num_gpu_blocks=num_gpu_blocks))
    runner = executor.model_runner
    model_config = runner.model_config
    grouping = group_layers(model_config.layer_sliding_windows) if hybrid else None
    runner.initialize_kv_cache(runner.determine_num_gpu_blocks(max_num_batched_tokens, grouping), 0, grouping)
    scheduler = Scheduler(
        SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                        max_model_len=runner.max_model_len),
        CacheConfig(block_size=16, num_gpu_blocks=num_gpu_blocks, enable_prefix_caching=prefix_caching,
                    sliding_window=model_config.sliding_window,
                    sliding_window_fraction=model_config.sliding_window_fraction,
                    kv_cache_groups=None if grouping is None else grouping.windows))
    return EngineCore(scheduler, executor), runner


def record_logits(runner):
    """Wrap compute_logits; returns the list each call's logits are appended to."""
    recorded = []
    compute_logits = runner.model.compute_logits

    def wrapper(hidden_states):
        logits = compute_logits(hidden_states)
        recorded.append(logits.clone())
        return logits

    runner.model.compute_logits = wrapper
    return recorded


def run_and_check(core, runner, hf_model, prompts, max_tokens):
    recorded = record_logits(runner)
    for index, prompt in enumerate(prompts):
        core.add_request(Request(f"r{index}", prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                                                     ignore_eos=True), eos_token_id=2))
    tokens = {f"r{index}": list(prompt) for index, prompt in enumerate(prompts)}
    checks = []  # (request id, position, logits row)
    while core.has_work():
        num_recorded = len(recorded)
        result = core.step()
        if result.scheduler_output is None or result.scheduler_output.is_empty:
            continue
        output = core.executor.last_output
        rows = torch.cat(recorded[num_recorded:]) if len(recorded) > num_recorded else torch.empty(0)
        sampled = [req_id for req_id in output.req_ids if output.sampled_token_ids[output.req_id_to_index[req_id]]]
        assert rows.shape[0] == len(sampled)  # logits only for rows that sample
        for row, req_id in zip(rows, sampled):
            checks.append((req_id, len(tokens[req_id]) - 1, row))
            tokens[req_id].append(output.sampled_token_ids[output.req_id_to_index[req_id]][0])
    expected = {req_id: hf_logits(hf_model, sequence) for req_id, sequence in tokens.items()}
    for req_id, position, row in checks:
        torch.testing.assert_close(row, expected[req_id][position], atol=ATOL, rtol=0,
                                   msg=f"{req_id} at position {position}")
    assert {req_id for req_id, _, _ in checks} == set(tokens)
    return tokens


class RecordingExecutor:
    """Keeps the last ModelRunnerOutput, to see which requests sampled in a step."""

    def __init__(self, executor):
        self.executor, self.last_output = executor, None

    def execute_model(self, scheduler_output):
        self.last_output = self.executor.execute_model(scheduler_output)
        return self.last_output


@pytest.fixture(scope="module")
def hf_model(tiny_llama_path):
    return load_hf_model(tiny_llama_path)


@pytest.mark.parametrize("num_gpu_blocks,budget", [(200, 64), (12, 48)], ids=["roomy", "preempting"])
def test_every_logits_row_matches_transformers(tiny_llama_path, hf_model, num_gpu_blocks, budget):
    core, runner = make_engine(tiny_llama_path, num_gpu_blocks, max_num_batched_tokens=budget)
    core.executor = RecordingExecutor(core.executor)
    prompts = mixed_prompts(runner.vocab_size, seed=5, num_prompts=8)
    run_and_check(core, runner, hf_model, prompts, max_tokens=6)
    if num_gpu_blocks == 12:
        assert core.scheduler.num_preemptions_total > 0
    manager = core.scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks
    assert runner.last_step_duration_s > 0 and runner.num_steps > 0


def test_prefill_logits_match(tiny_llama_path, hf_model):
    """A single step of whole-prompt prefills: the last-token logits of each prompt."""
    core, runner = make_engine(tiny_llama_path, 64, max_num_batched_tokens=512)
    recorded = record_logits(runner)
    prompts = mixed_prompts(runner.vocab_size, seed=9, num_prompts=6)
    for index, prompt in enumerate(prompts):
        core.add_request(Request(f"p{index}", prompt, SamplingParams(temperature=0.0, max_tokens=1)))
    core.step()
    assert len(recorded) == 1 and recorded[0].shape == (len(prompts), runner.vocab_size)
    for row, prompt in zip(recorded[0], prompts):
        torch.testing.assert_close(row, hf_logits(hf_model, prompt)[-1], atol=ATOL, rtol=0)


def test_runner_mirrors_the_scheduler(tiny_llama_path):
    """After every step the runner's copy of each request (blocks, tokens) equals the scheduler's,
    unwritten cache slots start as NaN and never leak into logits (new blocks are zeroed)."""
    core, runner = make_engine(tiny_llama_path, 10, max_num_batched_tokens=24, max_num_seqs=4)
    for key_cache, value_cache in runner.kv_caches:
        key_cache.fill_(float("nan"))
        value_cache.fill_(float("nan"))
    recorded = record_logits(runner)
    prompts = mixed_prompts(runner.vocab_size, seed=2, num_prompts=6)
    for index, prompt in enumerate(prompts):
        core.add_request(Request(f"m{index}", prompt, SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)))
    scheduler = core.scheduler
    while core.has_work():
        result = core.step()
        if result.scheduler_output is None:
            continue
        for req_id, request in scheduler.requests.items():
            state = runner.requests.get(req_id)
            if state is None:
                continue  # not scheduled yet
            assert state.output_token_ids == request.output_token_ids
            if req_id in result.scheduler_output.num_scheduled_tokens:
                assert state.block_ids == scheduler.kv_cache_manager.get_block_ids(req_id)
        batch = runner.input_batch
        assert set(batch.req_ids) == set(result.scheduler_output.num_scheduled_tokens)
    assert scheduler.num_preemptions_total > 0
    assert all(torch.isfinite(logits).all() for logits in recorded)
