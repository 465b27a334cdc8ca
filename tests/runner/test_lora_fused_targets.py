"""LoRA adapters of checkpoints that store q/k/v and gate/up fused (Phi-3, Phi-4: PEFT targets ``qkv_proj`` and
``gate_up_proj``; GLM-4: ``gate_up_proj`` beside separate q, k, v): read as one adapter per slice sharing the fused
A, they give transformers' tokens with the adapter merged into the fused weights by hand."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.core import LoRARequest
from engine.models import make_test_model
from engine.models.lora_checkpoint import adapted_projections, read_adapter
from engine.models.make_lora import make_lora_adapter
from engine.runner.lora.model_wrapping import target_shapes
from tests.engine.lora_fixtures import merged_hf_model
from tests.engine.model_fixtures import hf_greedy, load_hf_model

FUSED = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


@pytest.fixture(scope="module")
def phi3(tmp_path_factory):
    return make_test_model(tmp_path_factory.mktemp("phi3"), "phi3", seed=5, config_overrides={
        "partial_rotary_factor": 0.5})


def test_a_fused_adapter_gives_transformers_tokens_merged(phi3, tmp_path):
    adapter = make_lora_adapter(tmp_path / "fused", phi3, rank=4, alpha=8, targets=FUSED, seed=2)
    prompts = [[(11 * i + n) % 500 + 4 for i in range(n)] for n in (7, 23, 40)]
    merged = merged_hf_model(load_hf_model(phi3), adapter)
    base = load_hf_model(phi3)
    expected = [hf_greedy(merged, prompt, 8) for prompt in prompts]
    assert expected != [hf_greedy(base, prompt, 8) for prompt in prompts]  # the adapter changes the tokens
    llm = LLM(model=str(phi3), skip_tokenizer_init=True, enable_lora=True, max_loras=1, max_lora_rank=8,
              max_num_batched_tokens=16)
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True), use_tqdm=False,
                           lora_request=LoRARequest("fused", 1, str(adapter)))
    assert [list(output.outputs[0].token_ids) for output in outputs] == expected


def test_glm4s_fused_gate_up_beside_separate_qkv_gives_transformers_tokens_merged(tmp_path):
    glm = make_test_model(tmp_path / "glm4", "glm4", seed=5)
    adapter = make_lora_adapter(tmp_path / "adapter", glm, rank=4, alpha=8, seed=2,
                                targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_up_proj", "down_proj"))
    prompts = [[(11 * i + n) % 500 + 4 for i in range(n)] for n in (7, 23, 40)]
    expected = [hf_greedy(merged_hf_model(load_hf_model(glm), adapter), prompt, 8) for prompt in prompts]
    assert expected != [hf_greedy(load_hf_model(glm), prompt, 8) for prompt in prompts]
    llm = LLM(model=str(glm), skip_tokenizer_init=True, enable_lora=True, max_loras=1, max_lora_rank=8,
              max_num_batched_tokens=16)
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True), use_tqdm=False,
                           lora_request=LoRARequest("glm", 1, str(adapter)))
    assert [list(output.outputs[0].token_ids) for output in outputs] == expected


def test_a_fused_target_is_its_slices(phi3, tmp_path):
    from engine.models import load_model

    model, _ = load_model(phi3, torch.float32)
    shapes = target_shapes(model)
    adapter = read_adapter(make_lora_adapter(tmp_path / "fused", phi3, rank=4, targets=("qkv_proj",)), shapes, 8)
    assert adapter.target_modules == adapted_projections(("qkv_proj",)) == ("q_proj", "k_proj", "v_proj")
    a, b_q = adapter.weights[(0, "q_proj")]
    assert adapter.weights[(0, "k_proj")][0] is a  # one A, shared
    assert b_q.shape == (shapes.shapes["q_proj"][1], 4)
