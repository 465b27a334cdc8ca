"""Calibration and fidelity with images (CPU): sim.calibrate fits the vision encoder's cost from real runs of a LLaVA
checkpoint (``num_encoder_tokens``, chosen on the held-out steps that encode an image, with the image size it
measured in the provenance); the calibrated simulator then runs a workload with images, and sim.validate compares it
with a real run of another workload (other rate, a pool of popular images, shared prefixes) within a loose bound.
A profile fitted on images of another size is refused by name."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from engine.models.synthetic_tokenizer import save_tokenizer  # noqa: E402
from sim.calibrate import calibrate  # noqa: E402
from sim.engine_setup import SetupError, build_setup  # noqa: E402
from sim.real_engine import build_real_engine  # noqa: E402
from sim.real_run import run_real  # noqa: E402
from sim.validate import validate_recorded  # noqa: E402
from tests.models.engine_generation import save_random  # noqa: E402
from tests.models.test_llava_images import PROCESSOR, TEXT  # noqa: E402
from workloads import load_workload  # noqa: E402

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
ENGINE = {"block_size": 16, "num_gpu_blocks": 256, "max_num_seqs": 16, "max_num_batched_tokens": 256,
          "max_model_len": 1024}


def workload(path, name, seed, rate, images, **extra):
    return load_workload({
        "name": name, "seed": seed, "model": str(path), "hardware": "cpu", "dtype": "float32", "engine": ENGINE,
        "workload": {"num_requests": 90, "arrival": {"type": "poisson", "rate": rate},
                     "prompt_len": {"type": "uniform", "min": 16, "max": 240},
                     "output_len": {"type": "uniform", "min": 4, "max": 40}, "images": images, **extra}})


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    """A LLaVA whose encoder is a visible share of a step on the CPU: 64 tokens an image, four ViT layers."""
    from transformers import LlavaConfig, LlavaForConditionalGeneration

    path = tmp_path_factory.mktemp("llava-calibration")
    config = LlavaConfig(text_config={**TEXT, "model_type": "llama", "max_position_embeddings": 1024},
                         image_token_index=511,
                         vision_config=dict(model_type="clip_vision_model", hidden_size=128, intermediate_size=512,
                                            num_hidden_layers=4, num_attention_heads=4, image_size=112,
                                            patch_size=14))
    save_random(LlavaForConditionalGeneration(config), path)
    (path / "preprocessor_config.json").write_text(json.dumps(
        {**PROCESSOR, "crop_size": {"height": 112, "width": 112}, "size": {"shortest_edge": 112}}))
    save_tokenizer(path, 512, 256)
    return path


def record(spec, llava, out):
    real = build_real_engine(spec, model=str(llava), threads=1)
    run_real(spec, out, real.engine, vocab_size=real.vocab_size, reserved_token_ids=real.reserved_token_ids,
             executor_info=real.info, images=real.images)
    return out


def test_calibrated_images_predict_a_real_run_of_another_workload(llava, tmp_path):
    calibration = record(workload(llava, "images-calibration", 11, 40,
                                  {"fraction": 0.6, "count": {"type": "uniform", "min": 1, "max": 3}}),
                         llava, tmp_path / "calibration")
    profile_path = tmp_path / "profile.json"
    fit = calibrate([calibration], profile_path)
    assert fit.coefficients["num_encoder_tokens"] > 0
    provenance = json.loads(profile_path.read_text())["provenance"]
    images = provenance["images"]
    assert images["tokens_per_image"] == 64 and "num_encoder_tokens" in images["compute_terms"]
    assert set(images["held_out_median_ape_by_terms"]) == {"num_encoder_tokens",
                                                           "num_encoder_tokens+encoder_attention_work"}
    assert fit.error_summary()["num_held_out_encoder_steps"] == images["num_held_out_encoder_steps"] > 0

    validation = workload(llava, "images-validation", 12, 25,
                          {"fraction": 0.7, "count": {"type": "uniform", "min": 1, "max": 2}, "distinct": 20,
                           "popularity": {"zipf": 1.1}},
                          shared_prefix={"num_groups": 2, "prefix_len": 64, "fraction": 0.5})
    real_dir = record(validation, llava, tmp_path / "validation" / "real")
    comparison = validate_recorded(real_dir, tmp_path / "validation", profile=profile_path, sensitivity=False)
    metrics = comparison["metrics"]
    # Loose: a shared 2-core machine's speed moves by more than the model's error (docs/fidelity.md).
    assert abs(metrics["request_throughput"]["relative_error"]) < 0.25
    for name in ("ttft_ms.p50", "tpot_ms.p50", "e2e_ms.p50"):
        assert abs(metrics[name]["relative_error"]) < 0.6, (name, metrics[name])
    kinds = [row["kind"] for row in comparison["step_time_error"]["by_kind"]]
    assert any(kind.endswith(", encodes images") for kind in kinds)


@pytest.mark.filterwarnings("ignore:cost_model. the profile was fitted for model")
def test_a_profile_of_another_image_size_is_refused(llava, tmp_path):
    """(A profile without the encoder's terms: tests/sim/test_multimodal_sim.py.)"""
    profile = json.loads((ROOT / "sim" / "data" / "profiles" / "cpu-small-float32.json").read_text())
    profile["coefficients"]["num_encoder_tokens"] = 2e-5
    profile["features"].append("num_encoder_tokens")
    profile["provenance"]["images"] = {"tokens_per_image": 576}
    (tmp_path / "sized.json").write_text(json.dumps(profile))
    with pytest.raises(SetupError, match=r"workload.images: the profile measured images of 576 tokens; model .* "
                                         r"makes 64"):
        build_setup(workload(llava, "images", 3, 20, {"fraction": 0.5}), str(tmp_path / "sized.json"))
