"""Llama 4 (Scout's and Maverick's layout, small): logits and greedy tokens equal transformers' on a checkpoint that
transformers itself wrote, through chunked local attention (chunks of 16 tokens, crossed by every longer prompt),
NoPE layers with temperature tuning, L2 q/k norms, sigmoid-scaled experts with a shared expert, and dense layers
between the MoE ones; the multimodal checkpoint's layout (text_config, language_model.) loads as its language
model; chunked attention as virtual requests equals its definition."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.models import load_model
from engine.models.config import ModelConfig
from engine.runner.attention import build_attention_metadata, compute_positions
from engine.runner.attention.local_attention import local_attention_common
from tests.models.engine_generation import (assert_engine_generates_as_transformers, engine_and_transformers,
                                            random_prompt, save_random)
from tests.models.local_metadata import common_from_lists
from tests.models.test_models_vs_transformers import ATOL, PagedSession, hf_logits

CHUNK, BLOCK = 16, 8
TEXT_CONFIG = dict(vocab_size=512, hidden_size=64, intermediate_size=48, intermediate_size_mlp=96, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                   num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2, attention_chunk_size=CHUNK,
                   floor_scale=8, attn_scale=0.5, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                   rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


def write_llama4(path, seed=0, **overrides):
    """A random Llama4ForCausalLM saved by transformers (its own names and layout)."""
    from transformers import Llama4ForCausalLM, Llama4TextConfig

    return save_random(Llama4ForCausalLM(Llama4TextConfig(**{**TEXT_CONFIG, **overrides})), path, seed)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_llama4(tmp_path_factory.mktemp("llama4"))


@pytest.fixture(scope="module")
def models(checkpoint):
    return engine_and_transformers(checkpoint)


_prompt = random_prompt


def test_the_config_reads_as_transformers_does(models):
    _, config, hf_model = models
    assert config.layer_uses_rope == (True, True, True, False)  # every fourth layer without RoPE
    assert config.moe.dense_layers == (0, 2) == tuple(index for index in range(4) if index not in
                                                      hf_model.config.moe_layers)


def test_batched_prefill_matches(models):
    model, config, hf_model = models
    prompts = {f"r{n}": _prompt(n, n) for n in (3, 16, 17, 40)}
    logits = PagedSession(model, config, block_size=BLOCK, attention_chunk=CHUNK).step(prompts)
    for name, tokens in prompts.items():
        torch.testing.assert_close(logits[name], hf_logits(hf_model, tokens), atol=ATOL, rtol=0, msg=name)


def test_chunked_prefill_and_decodes_across_chunk_boundaries_match(models):
    model, config, hf_model = models
    tokens = _prompt(7, 45)
    expected = hf_logits(hf_model, tokens)
    session = PagedSession(model, config, block_size=BLOCK, seed=2, attention_chunk=CHUNK)
    got = [session.step({"r": tokens[:13]})["r"], session.step({"r": tokens[13:34]})["r"]]
    got += [session.step({"r": [token]})["r"] for token in tokens[34:]]
    torch.testing.assert_close(torch.cat(got), expected, atol=ATOL, rtol=0)


def test_the_chunks_matter(models):
    """Against a model that attends everything: without the local metadata the chunked layers refuse to run, and
    with the whole context as one chunk a 40-token prompt is another model."""
    model, config, hf_model = models
    tokens = _prompt(40, 40)
    session = PagedSession(model, config, block_size=BLOCK)
    with pytest.raises(RuntimeError, match="need the step's local-attention metadata"):
        session.step({"r": tokens})
    metadata = build_attention_metadata([0], [40], [list(range(1, 6))], BLOCK)
    metadata.local = metadata  # every key visible
    caches = PagedSession(model, config, block_size=BLOCK).kv_caches
    with torch.no_grad():
        unchunked = model.compute_logits(model(torch.tensor(tokens), compute_positions([0], [40]), caches, metadata))
    assert (unchunked - hf_logits(hf_model, tokens)).abs().max() > 20 * ATOL


def test_the_engine_generates_what_transformers_generates(checkpoint):
    """Through the scheduler: 30-token prompts in chunks of 16 budget tokens, 8 tokens each, past a chunk boundary."""
    prompts = [_prompt(seed, 30) for seed in range(3)]
    llm = assert_engine_generates_as_transformers(checkpoint, prompts, max_num_batched_tokens=16, block_size=BLOCK,
                                                  max_model_len=128)
    manager = llm.scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks


def test_the_chunked_groups_hand_back_blocks_and_the_tokens_stay_the_same(checkpoint):
    """vLLM's hybrid KV cache for Llama 4: the NoPE layer in a full group, each chunked layer in a group that hands
    back the blocks before its requests' current chunk (engine/core/kv_cache_manager.py). Under preemption and
    prefix hits (a prompt sent twice), the tokens equal those of one table keeping every block (which the test above
    equates with transformers'), and blocks were handed back while they ran."""
    from engine import LLM, SamplingParams

    prompts = [_prompt(3, 30), _prompt(4, 37), _prompt(3, 30), _prompt(5, 12)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    options = dict(model=str(checkpoint), skip_tokenizer_init=True, block_size=BLOCK, max_model_len=128,
                   max_num_batched_tokens=16, num_gpu_blocks=40)
    kept = LLM(**options, disable_hybrid_kv_cache_manager=True)
    assert kept.scheduler.cache_config.kv_cache_groups is None
    expected = [output.outputs[0].token_ids for output in kept.generate(prompts, params, use_tqdm=False)]
    hybrid = LLM(**options)
    manager = hybrid.scheduler.kv_cache_manager
    assert hybrid.scheduler.cache_config.kv_cache_groups == (None, CHUNK, CHUNK, CHUNK)
    assert [group.attention_chunk for group in manager.groups] == [None, CHUNK, CHUNK, CHUNK]
    handed_back = []
    for group in manager.groups[1:]:
        def counting(request, num_computed_tokens, group=group, original=group.free_blocks_out_of_window_at):
            before = group.num_skipped_block[request.request_id]
            original(request, num_computed_tokens)
            handed_back.append(group.num_skipped_block[request.request_id] - before)
        group.free_blocks_out_of_window_at = counting
    outputs = [output.outputs[0].token_ids for output in hybrid.generate(prompts, params, use_tqdm=False)]
    assert outputs == expected
    assert sum(handed_back) > 0 and hybrid.scheduler.num_preemptions_total > 0
    assert manager.make_prefix_cache_stats().hits > 0
    assert manager.num_free_blocks == manager.num_usable_blocks


def test_the_multimodal_checkpoint_loads_as_its_language_model(checkpoint, tmp_path, models):
    """Llama4ForConditionalGeneration's layout: the text keys in text_config, the weights under language_model.,
    a vision tower beside them (not loaded)."""
    text = json.loads((checkpoint / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4", "text_config": text,
        "vision_config": {"hidden_size": 32}, "tie_word_embeddings": False}))
    tensors = {f"language_model.{name}": tensor for name, tensor in load_file(checkpoint / "model.safetensors").items()}
    tensors["vision_model.patch_embedding.linear.weight"] = torch.zeros(4, 4)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    model, config = load_model(tmp_path, torch.float32)
    assert config.architecture == "Llama4ForConditionalGeneration" and not model.unexpected_weights
    original, _, _ = models
    for (name, parameter), (_, expected) in zip(model.named_parameters(), original.named_parameters()):
        assert torch.equal(parameter, expected), name


def test_a_block_size_that_does_not_divide_the_chunk_is_refused(checkpoint):
    from engine import LLM

    with pytest.raises(ValueError, match="block_size 12 must divide the model's attention_chunk_size 16"):
        LLM(model=str(checkpoint), skip_tokenizer_init=True, block_size=12)
    assert ModelConfig.from_pretrained(checkpoint).model_type == "llama4_text"


@pytest.mark.parametrize("computed, scheduled", [([0], [40]), ([13, 0, 30], [21, 5, 1]), ([15, 16], [1, 17])])
def test_virtual_requests_are_chunked_attention(computed, scheduled):
    """Each virtual request's keys are exactly its queries' chunk up to them: positions chunk_start .. p."""
    blocks = [list(range(1 + 10 * index, 11 + 10 * index)) for index in range(len(computed))]
    local = local_attention_common(common_from_lists(computed, scheduled, blocks, BLOCK), CHUNK, BLOCK)
    flat = 0
    for piece in range(local.num_reqs):
        length = int(local.query_start_loc[piece + 1] - local.query_start_loc[piece])
        context = int(local.num_computed_tokens[piece])
        for offset in range(length):
            # The flat token's request and position, from the original batch.
            request = int(np.searchsorted(np.cumsum(scheduled), flat, side="right"))
            position = computed[request] + flat - int(np.concatenate([[0], np.cumsum(scheduled)])[request])
            chunk_start = position - position % CHUNK
            assert context + offset == position - chunk_start  # keys before it in its chunk, no more
            first_block = int(local.block_table[piece, 0])
            assert first_block == blocks[request][chunk_start // BLOCK]
            flat += 1
    assert flat == sum(scheduled)


def test_it_drafts_for_itself_with_every_draft_accepted(checkpoint):
    """A Llama 4 draft model's forwards build their own chunked metadata (draft_model.py), over the full group's table
    of the hybrid KV cache (its KV beside those blocks, never handed back); and on one table of every layer."""
    from engine import LLM, SamplingParams

    prompts = [_prompt(seed, 20) for seed in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    options = dict(model=str(checkpoint), skip_tokenizer_init=True, block_size=BLOCK, max_model_len=128)
    plain = [o.outputs[0].token_ids for o in LLM(**options).generate(prompts, params, use_tqdm=False)]
    for hybrid in (True, False):
        llm = LLM(**options, disable_hybrid_kv_cache_manager=not hybrid,
                  speculative_config={"model": str(checkpoint), "num_speculative_tokens": 3})
        assert (llm.scheduler.cache_config.kv_cache_groups is not None) == hybrid
        assert [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)] == plain
        stats = llm.scheduler.make_stats().spec_decoding
        assert stats["num_accepted_tokens"] == stats["num_draft_tokens"] > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_engine_generates_the_cpu_tokens(checkpoint):
    """The chunked layers' virtual requests on the GPU's default backend (triton; benchmarks/gpu_check.sh runs it)."""
    from tests.models.engine_generation import assert_cuda_generates_the_cpu_tokens

    assert_cuda_generates_the_cpu_tokens(checkpoint)
