"""Real runs of a workload with images (CPU): the generated tiny LLaVA (the workload's model, no --model needed)
encodes each image the shared scheduler schedules, a pool image shown again is encoded once while kept, and the
simulator driving the same core from the recording takes exactly the same decisions, encoder work included."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from analysis import read_run  # noqa: E402
from sim.real_engine import build_real_engine  # noqa: E402
from sim.real_images import picture  # noqa: E402
from sim.real_run import run_real  # noqa: E402
from sim.vision_setup import VisionSetupError  # noqa: E402
from tests.models.test_llava_images import TOKENS_PER_IMAGE  # noqa: E402
from tests.sim.test_sliding_window_real_run import assert_replays_exactly  # noqa: E402
from workloads import load_workload  # noqa: E402

WORKLOAD = {
    "name": "tiny-llava", "seed": 4, "model": "tiny-llava", "hardware": "cpu", "dtype": "float32",
    "engine": {"block_size": 8, "num_gpu_blocks": 40, "max_num_seqs": 6, "max_num_batched_tokens": 24,
               "max_model_len": 256, "enable_prefix_caching": True},
    "workload": {"num_requests": 14, "arrival": {"type": "poisson", "rate": 200},
                 "prompt_len": {"type": "uniform", "min": 8, "max": 40},
                 "output_len": {"type": "uniform", "min": 4, "max": 16},
                 "shared_prefix": {"num_groups": 1, "prefix_len": 8, "fraction": 0.5},
                 "images": {"fraction": 0.8, "count": {"type": "uniform", "min": 1, "max": 2}, "distinct": 3}},
}


def test_a_real_run_with_images_encodes_them_and_replays_exactly(tmp_path):
    workload = load_workload(WORKLOAD)
    real = build_real_engine(workload, threads=1)
    assert real.info["model"] == "servesim-tiny-llava"
    scheduler = real.engine.scheduler
    # vLLM's sizing: the step's encoder budget and the encoder cache hold at least one image.
    assert scheduler.encoder_compute_budget == 24 and real.info["tokens_per_image"] == TOKENS_PER_IMAGE
    encoder = real.images.inputs
    runner_outputs = real.engine.executor.model_runner.encoder_outputs
    out = tmp_path / "real"
    result = run_real(workload, out, real.engine, vocab_size=real.vocab_size,
                      reserved_token_ids=real.reserved_token_ids, executor_info=real.info, images=real.images)
    assert result.summary["num_finished"] == 14
    manager = scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks
    run = read_run(out)
    shown = int(run.requests["num_images"].sum())
    encoded = int(run.steps["num_encoder_items"].sum())
    # Every recorded encoding ran in the runner; a pool of three images shown more often is encoded less often.
    assert encoded == runner_outputs.num_items_encoded and 3 <= encoded < shown
    assert (run.requests["num_image_tokens"] == run.requests["num_images"] * TOKENS_PER_IMAGE).all()
    assert run.summary["config"]["tokens_per_image"] == TOKENS_PER_IMAGE
    replayed = assert_replays_exactly(out)
    assert int(replayed.steps["num_encoder_items"].sum()) == encoded
    # The same identifier is the same picture in every run.
    assert (picture("image-4-p0", encoder.image_size) == picture("image-4-p0", encoder.image_size)).all()


def test_a_real_run_refuses_images_the_model_cannot_take(tmp_path_factory):
    from tests.engine.model_fixtures import make_tiny_llama

    workload = load_workload(WORKLOAD)
    with pytest.raises(VisionSetupError, match=r"workload.images: the real model encodes no images; pass --model"):
        build_real_engine(workload, model=str(make_tiny_llama(tmp_path_factory)), threads=1)
    sized = load_workload({**WORKLOAD, "workload": {**WORKLOAD["workload"], "images": {
        "fraction": 0.5, "tokens_per_image": {"type": "constant", "value": 20}}}})
    with pytest.raises(VisionSetupError, match=r"workload.images.tokens_per_image: the real model's images are 16 "
                                               r"tokens each"):
        build_real_engine(sized, threads=1)
