"""Speculative decoding with EAGLE and EAGLE-3 heads (methods eagle and eagle3, sim/eagle_draft.py): a one-layer dense
draft at the target's width, looking tokens up in the target's embedding, scoring over the target's lm_head (eagle)
or its own smaller vocabulary (eagle3), its layer's KV beside the model's."""

from __future__ import annotations

import json

import pytest

from sim.eagle_draft import eagle_draft_shape
from sim.engine_setup import build_setup
from sim.hardware import resolve_hardware
from sim.kv_cache_capacity import kv_cache_num_blocks
from sim.model_presets import resolve_model
from sim.run import main as sim_run_main
from workloads import example_path, load_workload
from workloads.errors import WorkloadError


def spec(method: str, tokens: int = 3, extra: str = "") -> str:
    return (f"engine.speculative_decoding={{method: {method}, num_speculative_tokens: {tokens}, "
            f"acceptance_rate: [0.75, 0.6, 0.5]{extra}}}")


def workload(*overrides):
    return load_workload(example_path("spec_decode"), overrides=["sweep=null", "workload.num_requests=60", *overrides])


def test_the_heads_are_one_dense_layer_at_the_targets_width():
    model = resolve_model("llama-3-8b")
    eagle, eagle3 = eagle_draft_shape(model, "eagle"), eagle_draft_shape(model, "eagle3")
    for head in (eagle, eagle3):
        assert head.num_layers == 1 and head.hidden_size == 4096 and head.num_kv_heads == 8
        assert head.intermediate_size == 14336 and not head.is_moe
    # EAGLE-1 scores over the target's 128,256 tokens with the target's lm_head: only its layer is its own (218M; the
    # published head is 250M with its fc). EAGLE-3 has its own head over 32,000 tokens.
    assert eagle.vocab_size == 128256 and eagle.num_parameters / 1e6 == pytest.approx(218.1, rel=0.01)
    assert eagle3.vocab_size == 32000
    assert eagle3.num_parameters - eagle.num_parameters == 32000 * 4096
    # A mixture of experts gets a dense head; latent attention a plain one.
    deepseek_head = eagle_draft_shape(resolve_model("deepseek-v3"), "eagle3", draft_vocab_size=64000)
    assert not deepseek_head.is_moe and not deepseek_head.is_mla and deepseek_head.vocab_size == 64000


def test_the_head_holds_its_layers_cache_and_weights_beside_the_models():
    setup = build_setup(workload(spec("eagle3")))
    draft = setup.speculation.draft_cost_model
    assert setup.speculation.method == "eagle3" and draft.model.name == "llama-3-8b EAGLE-3 head"
    assert setup.scheduler_config.num_lookahead_tokens == 3
    model, hardware = resolve_model("llama-3-8b"), resolve_hardware("h100-sxm")
    without = kv_cache_num_blocks(model, hardware, "bfloat16", 16, 0.9)
    assert setup.cache_config.num_gpu_blocks == kv_cache_num_blocks(
        model, hardware, "bfloat16", 16, 0.9, draft_model=eagle_draft_shape(model, "eagle3"))
    assert setup.cache_config.num_gpu_blocks < without * 32 / 33  # 33 layers of cache a block instead of 32


def test_eagle_heads_cut_tpot_more_than_a_draft_model_of_the_same_acceptance(tmp_path):
    tpot = {}
    runs = {"off": ["engine.speculative_decoding.num_speculative_tokens=0"], "eagle": [spec("eagle")], "eagle3": [spec("eagle3")],
            "draft_model": [spec("draft_model", extra=", draft_model: llama-3.2-1b")]}
    for name, overrides in runs.items():
        out = tmp_path / name
        assert sim_run_main(["spec_decode", "--set", "sweep=null", "--set", "workload.num_requests=80", "--set",
                             "workload.arrival.rate=2", *[arg for o in overrides for arg in ("--set", o)],
                             "--out", str(out), "--no-progress", "--no-dashboard", "--quiet"]) == 0
        tpot[name] = json.loads((out / "summary.json").read_text())["tpot_ms"]["p50"]
    # The same acceptance (2.4 tokens a verification): a one-layer head's passes cost far less than a 1B model's
    # three, and EAGLE-3's smaller vocabulary less than scoring over the target's 128,256 tokens.
    assert tpot["eagle3"] < tpot["eagle"] < tpot["draft_model"] < tpot["off"]
    assert tpot["off"] / tpot["eagle3"] > 1.8


def test_what_the_heads_cannot_take_is_refused_by_field():
    with pytest.raises(WorkloadError, match="draft_vocab_size"):
        workload(spec("eagle", extra=", draft_vocab_size: 32000"))
    with pytest.raises(WorkloadError, match="draft_model"):
        workload(spec("ngram", extra=", draft_model: llama-3.2-1b"))


def test_a_named_heads_checkpoint_gives_its_own_shape(tmp_path):
    """With draft_model naming the head's folder (what real runs load), the simulation prices the head's own heads, MLP
    and draft vocabulary; a head of another width is refused by field."""
    model = resolve_model("llama-3-8b")
    head = eagle_draft_shape(model, "eagle3", head_config={
        "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 8192,
        "draft_vocab_size": 16000})
    assert (head.intermediate_size, head.vocab_size, head.num_kv_heads, head.head_dim) == (8192, 16000, 8, 128)
    with pytest.raises(ValueError, match="the head's hidden_size 2048 is not the target's 4096"):
        eagle_draft_shape(model, "eagle", head_config={"hidden_size": 2048})
    folder = tmp_path / "head"
    folder.mkdir()
    (folder / "config.json").write_text('{"hidden_size": 4096, "intermediate_size": 8192, "num_attention_heads": 32,'
                                        ' "num_key_value_heads": 8, "draft_vocab_size": 16000}')
    setup = build_setup(workload(spec("eagle3", extra=f", draft_model: {folder}")))
    assert setup.speculation.draft_cost_model.model.vocab_size == 16000
    from sim.engine_setup import SetupError

    with pytest.raises(SetupError, match="engine.speculative_decoding.draft_model: '/no/head' has no config.json"):
        build_setup(workload(spec("eagle", extra=", draft_model: /no/head")))
