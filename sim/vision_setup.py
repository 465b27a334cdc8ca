"""What a workload with images needs of a simulated engine: the model's vision encoder, priced in the cost model,
and vLLM's encoder budget and cache sized for the largest image.

vLLM sizes both at start-up (``compute_encoder_budget``): the step's encoder budget
(``max_num_encoder_input_tokens``) and the encoder cache (``encoder_cache_size``) default to
``max_num_batched_tokens``, and either is raised to the model's largest item, so that one image always fits. The
simulator does the same with the largest image the workload holds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from engine.core import SchedulerConfig
from sim.cost_models import AnalyticalCostModel, CostModel
from sim.hf_vision_config import vision_encoder_from_hf_path
from sim.model_presets import MODEL_PRESETS
from sim.model_shapes import ModelShape
from sim.vision_encoders import VisionEncoderShape, resolve_vision_encoder
from workloads import RequestSpec, WorkloadConfig


class VisionSetupError(ValueError):
    """A workload's images cannot be simulated as asked; the message names the field."""


@dataclass(frozen=True, slots=True)
class VisionSetup:
    encoder: VisionEncoderShape

    @property
    def tokens_per_image(self) -> int | None:
        return self.encoder.tokens_per_image

    def describe(self) -> dict:
        return {"vision_encoder": self.encoder.name, "tokens_per_image": self.encoder.tokens_per_image}


def vision_setup(workload: WorkloadConfig, model: ModelShape, cost_model: CostModel) -> VisionSetup | None:
    """The model's vision encoder, priced in ``cost_model`` (None for a workload without images): the workload's
    ``vision_encoder:`` where set, else the one the checkpoint's config.json describes (``model:`` a path to a
    vision-language model's), else the model preset's own."""
    sections = workload.image_sections()
    if not sections:
        return None
    where = sections[0][0]
    encoder = _encoder_of_model_path(workload) if workload.vision_encoder is None else None
    if encoder is None:
        try:
            encoder = resolve_vision_encoder(model.name, workload.vision_encoder)
        except ValueError as error:
            raise VisionSetupError(f"vision_encoder: {error}") from None
    if encoder is None:
        raise VisionSetupError(f"{where}: model {model.name!r} has no vision encoder this simulator knows; set "
                               "vision_encoder (a preset name or its fields)")
    if not isinstance(cost_model, AnalyticalCostModel):
        _check_calibrated_images(cost_model, encoder, where)
        return VisionSetup(encoder)
    try:
        cost_model.price_vision(encoder)
    except ValueError as error:
        raise VisionSetupError(f"{where}: {error}") from None
    return VisionSetup(encoder)


def _check_calibrated_images(cost_model: CostModel, encoder: VisionEncoderShape, where: str) -> None:
    """A calibrated profile prices images only if it was fitted on runs with them (its encoder terms), and only
    images of the size it measured (``provenance.images.tokens_per_image``)."""
    profile = getattr(cost_model, "profile", None)
    if profile is None or not profile.prices_vision:
        raise VisionSetupError(f"{where}: the cost model ({cost_model.name}) has no term for the vision encoder: a "
                               "calibrated profile prices images only when sim.calibrate fitted it on real runs with "
                               "images; use the analytical cost model, or calibrate on such runs")
    measured = (profile.provenance.get("images") or {}).get("tokens_per_image")
    if measured is not None and encoder.tokens_per_image not in (None, measured):
        raise VisionSetupError(f"{where}: the profile measured images of {measured} tokens; model "
                               f"{encoder.name!r} makes {encoder.tokens_per_image}")


def _encoder_of_model_path(workload: WorkloadConfig) -> VisionEncoderShape | None:
    """The encoder a vision-language checkpoint's config.json describes, where ``model:`` is its path (None for a
    preset name, which wins over a path of the same name as it does in resolve_model, or a text model's config).
    A malformed vision_config is refused naming ``model:`` (the message says so already)."""
    if workload.model.lower() in MODEL_PRESETS:
        return None
    try:
        return vision_encoder_from_hf_path(workload.model)
    except ValueError as error:
        raise VisionSetupError(str(error)) from None


def size_encoder_budget(scheduler_config: SchedulerConfig, workload: WorkloadConfig, requests: list[RequestSpec],
                        encoder: VisionEncoderShape) -> SchedulerConfig:
    """The scheduler's encoder budget and cache, as vLLM sizes them: the engine's figure (or
    max_num_batched_tokens), raised to the largest image of ``requests``; images kept whole in a chunk where the
    engine asks it or the model attends among an image's tokens both ways (``encoder.images_whole``)."""
    largest = max((tokens for spec in requests for _, _, tokens in spec.images), default=0)
    if not largest:
        return scheduler_config
    engine = workload.engine
    budget = max(engine.max_num_encoder_input_tokens or engine.max_num_batched_tokens, largest)
    cache = max(engine.encoder_cache_size or engine.max_num_batched_tokens, largest)
    return replace(scheduler_config, max_num_encoder_input_tokens=budget, encoder_cache_size=cache,
                   disable_chunked_mm_input=engine.disable_chunked_mm_input or encoder.images_whole)
