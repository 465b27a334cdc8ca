"""The real executor: input batch, attention metadata and backends, model forward and sampling.

The seed's section 5 / 7, one file per stage:

    executor.py            RealExecutor: the core's Executor protocol over a ModelRunner
    model_runner.py        ModelRunner.execute_model: _update_states -> prepare -> forward -> sample
    state_updates.py       the runner's copy of each request brought up to date with the scheduler's decisions
    request_state.py       CachedRequestState: what the runner keeps per request (its generator, too)
    input_batch.py         InputBatch: persistent per-row arrays, holes condensed each step
    block_table.py         BlockTable: per-row physical block ids, slot_mapping
    prepare_inputs.py      input_ids, positions, query_start_loc, seq_lens, slot_mapping, logits_indices
    attention_builders.py  CommonAttentionMetadata -> each backend's AttentionMetadata
    attention/             paged attention backends (torch, flash_attn, ...); local_attention.py: chunked layers
    sampling_batch.py      SamplingMetadata for the sampling rows, reused while they do not change
    sampler/               the Sampler
    structured_output/     grammars for structured outputs: xgrammar backend, per-request matchers, logits mask
    spec_decode/           speculative decoding: n-gram and draft-model proposers, verification
    logprobs_lists.py      per-request logprob payloads for the front end
    prompt_logprobs.py     prompt logprobs across prefill chunks
    kv_cache_sizing.py     how many KV blocks a memory budget buys
    config.py              RunnerConfig; device, backend and dtype defaults

Nothing is imported here: ``engine.models`` imports ``engine.runner.attention``, and this package's
modules import ``engine.models``, so eager imports would be circular.
"""
