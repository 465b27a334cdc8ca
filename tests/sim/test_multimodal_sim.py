"""Simulated runs with images: the vision encoder's work in the trace and the summary, vLLM's encoder budget sized
for the largest image, and what the simulator refuses (a profile without an encoder term, a model without an
encoder, real runs of a text model or through a server)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from sim.engine_setup import SetupError, build_setup
from sim.run_pipeline import run_simulation
from sim.real_images import check_real_run_images
from sim.vision_setup import VisionSetupError
from workloads import load_workload_text

ROOT = Path(__file__).resolve().parents[2]

SMALL = """
name: images
seed: 1
model: qwen2-vl-7b
hardware: h100-sxm
engine: {max_num_seqs: 32, max_num_batched_tokens: 2048, max_model_len: 8192}
workload:
  num_requests: 80
  arrival: {type: poisson, rate: 6}
  prompt_len: {type: uniform, min: 50, max: 400}
  output_len: {type: uniform, min: 5, max: 60}
  images: {fraction: 0.8, count: {type: uniform, min: 1, max: 2}, tokens_per_image: {type: constant, value: 700}}
slo: {ttft_ms: 2000}
"""


def small(*overrides):
    return load_workload_text(SMALL, overrides=list(overrides))


def run(workload, tmp_path):
    result = run_simulation(workload, tmp_path)
    return result.summary, pd.read_parquet(tmp_path / "requests.parquet"), pd.read_parquet(tmp_path / "steps.parquet")


def test_every_new_image_is_encoded_once_and_the_trace_says_where(tmp_path):
    summary, requests, steps = run(small(), tmp_path)
    assert summary["num_finished"] == 80
    images = summary["multimodal"]
    assert images["images_shown"] == requests["num_images"].sum() > 60
    # Every image is new, and nothing is preempted: each is encoded exactly once.
    assert images["images_encoded"] == images["images_shown"]
    assert images["encoder_tokens"] == images["image_tokens_shown"] == 700 * images["images_shown"]
    assert images["encoder_tokens_saved_fraction"] == 0.0
    # No step encodes past its budget (max_num_batched_tokens 2048 here, as vLLM defaults it).
    assert steps["num_encoder_tokens"].max() <= 2048
    assert summary["config"]["scheduler"]["max_num_encoder_input_tokens"] == 2048
    # An image request waits for its encoder: its first token comes later than a text request's.
    assert images["ttft_ms_p50_with_images"] > images["ttft_ms_p50_text_only"]


def test_repeated_images_are_served_from_the_encoder_cache_or_the_prefix_cache(tmp_path):
    new, _, _ = run(small(), tmp_path / "new")
    # Five images of 700 tokens, a cache of 2,048 tokens (two of them): repeats often find theirs evicted.
    pooled, _, _ = run(small("workload.images.distinct=5"), tmp_path / "pooled")
    assert pooled["multimodal"]["images_shown"] == new["multimodal"]["images_shown"]
    assert 5 < pooled["multimodal"]["images_encoded"] < new["multimodal"]["images_shown"] * 0.7
    assert pooled["ttft_ms"]["p50"] < new["ttft_ms"]["p50"]
    # A cache that holds all five: each is encoded once.
    roomy, _, _ = run(small("workload.images.distinct=5", "engine.encoder_cache_size=8192"), tmp_path / "roomy")
    assert roomy["multimodal"]["images_encoded"] == 5
    assert roomy["multimodal"]["encoder_tokens_saved_fraction"] > 0.9


def test_the_encoder_budget_and_cache_are_raised_to_the_largest_image(tmp_path):
    workload = small("engine.max_num_batched_tokens=512", "engine.encoder_cache_size=600")
    setup = build_setup(workload)
    assert setup.scheduler_config.max_num_encoder_input_tokens == 700
    assert setup.scheduler_config.encoder_cache_size == 700
    summary, _, steps = run(workload, tmp_path)
    assert summary["num_finished"] == 80
    assert steps["num_encoder_items"].max() == 1  # one 700-token image a step at most


def test_gemma_3_keeps_each_image_in_one_chunk_as_vllm_does(tmp_path):
    """Gemma 3's image tokens attend each other both ways, so vLLM (and the engine) prefill an image in one chunk;
    other models chunk images unless the workload says not to."""
    assert not build_setup(small()).scheduler_config.disable_chunked_mm_input
    gemma = small("model=gemma-3-4b", "workload.images.tokens_per_image=null", "engine.max_num_batched_tokens=300")
    assert build_setup(gemma).scheduler_config.disable_chunked_mm_input
    summary, _, steps = run(gemma, tmp_path)
    assert summary["num_finished"] == 80 and steps["num_encoder_items"].sum() > 0


@pytest.mark.filterwarnings("ignore:cost_model")  # the profile's model is not this one: it says so too
def test_a_profile_without_an_encoder_term_is_refused():
    with pytest.raises(SetupError, match=r"workload.images: the cost model \(calibrated\) has no term for the vision "
                                         r"encoder: a calibrated profile prices images only when sim.calibrate fitted"):
        build_setup(small(), str(ROOT / "sim/data/profiles/cpu-small-float32.json"))


def test_a_model_without_a_vision_encoder_needs_one_named():
    with pytest.raises(SetupError, match="model 'llama-3-8b' has no vision encoder.*set vision_encoder"):
        build_setup(small("model=llama-3-8b"))
    setup = build_setup(small("model=llama-3-8b", "vision_encoder=clip-vit-l-336"))
    assert setup.vision.encoder.name == "clip-vit-l-336"
    with pytest.raises(SetupError, match="vision_encoder"):
        build_setup(small("vision_encoder=no-such-encoder"))


def test_real_runs_of_images_need_a_model_that_encodes_them():
    with pytest.raises(VisionSetupError, match="workload.images: the real model encodes no images; pass --model"):
        check_real_run_images(small(), None)
    with pytest.raises(VisionSetupError, match="workload.images: images are not sent to a server"):
        check_real_run_images(small(), None, executor="server")


def test_the_dashboard_shows_the_encoder_work_and_ttft_with_and_without_images(tmp_path):
    from analysis.dashboard.build import assemble_dashboard, prepare_runs
    from analysis.dashboard.multimodal_figure import multimodal_figure

    run_simulation(small(), tmp_path / "images")
    run_simulation(small("workload.images=null"), tmp_path / "text")
    runs = prepare_runs([tmp_path / "images", tmp_path / "text"])
    figure = multimodal_figure(runs)
    names = [trace.name for trace in figure.figure.data]
    # The run with images: its encoder work, and a TTFT curve each for requests with and without images.
    assert names == ["images", "images with images", "images text only"]
    encoder_tokens_per_s = figure.figure.data[0]
    assert sum(encoder_tokens_per_s.y) > 0
    assert multimodal_figure(prepare_runs([tmp_path / "text"])) is None
    assert "images" in [section.section_id for section in assemble_dashboard(runs).sections]


def test_later_turns_resend_their_images_and_find_them_cached(tmp_path):
    # Each conversation shows its images in the first turn; later turns resend the conversation, images included
    # at the same offsets, and find them as prefix-cache hits (no encoder work for them).
    workload = small("workload.num_requests=30", "workload.images.distinct=null",
                     "workload.sessions={turns: {type: constant, value: 3}, user_len: {type: constant, value: 20}}")
    summary, requests, _ = run(workload, tmp_path)
    assert summary["num_finished"] == 90
    later = requests[requests["turn"] > 1]
    first = requests[requests["turn"] == 1].set_index("request_id")
    assert (later["num_images"].to_numpy() == first.loc[later["session_id"], "num_images"].to_numpy()).all()
    images = summary["multimodal"]
    assert images["images_shown"] == 3 * first["num_images"].sum()
    assert images["images_encoded"] < images["images_shown"] * 0.5  # the later turns' images were prefix hits


def test_a_cluster_routes_requests_with_images(tmp_path):
    summary, requests, _ = run(small("cluster={num_replicas: 2, router: prefix_aware}", "workload.images.distinct=4"),
                               tmp_path)
    assert summary["num_finished"] == 80 and summary["multimodal"]["images_shown"] == requests["num_images"].sum()
