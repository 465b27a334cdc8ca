"""The vision encoder of a multimodal model, as far as cost is concerned, and which model has which.

A multimodal LLM (LLaVA, Qwen2-VL, Gemma 3) turns each image into placeholder tokens of its prompt: a vision
transformer (ViT) encodes the image's patches, and a projector maps the result into the LLM's hidden size.
The scheduler counts an image by its placeholder tokens (``SchedulerOutput.encoder_input_lengths``); the
ViT works on patches, ``patches_per_token`` of them per placeholder token:

- LLaVA-1.5: one patch per token (the CLIP grid of 24 x 24 = 576 patches; its CLS patch is dropped);
- Qwen2-VL: four (the merger concatenates each 2 x 2 block of patches into one token);
- Gemma 3: sixteen (4 x 4 average pooling of a 64 x 64 grid of 4096 patches into 256 tokens).

Every ViT here is a pre-norm transformer with a plain (not gated) GELU MLP and full (not causal) attention
within one image. ``VisionEncoderShape`` holds what prices it (sim/cost_models/vision_encoder_cost.py);
``resolve_vision_encoder`` turns a workload's ``vision_encoder:`` (or its absence) into one.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields, replace


@dataclass(frozen=True, slots=True)
class VisionEncoderShape:
    name: str
    num_layers: int               # the layers the server runs (LLaVA stops one short of the checkpoint's)
    hidden_size: int
    intermediate_size: int        # the MLP's width
    num_attention_heads: int
    patches_per_token: int        # ViT patches per LLM placeholder token
    # Placeholder tokens of every image, for fixed-resolution encoders; None for dynamic resolution (Qwen2-VL),
    # where the workload states each image's tokens.
    tokens_per_image: int | None
    # The multimodal projector's parameters; it runs once per placeholder token (after any pooling or merge).
    projector_parameters: int
    gated_mlp: bool = False       # ViTs use a plain GELU MLP: two matrices, not three
    # Windowed attention (Qwen2.5-VL): each window holds this many placeholder tokens' patches (None: every layer
    # attends over the whole image), and full_attention_layers of the layers attend over the whole image anyway.
    window_tokens: int | None = None
    full_attention_layers: int = 0
    # The language model attends among one image's tokens both ways (Gemma 3), so vLLM prefills each image in one
    # chunk (it turns disable_chunked_mm_input on for such models), as the engine does.
    images_whole: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"vision_encoder.name must be a non-empty string, got {self.name!r}")
        for name in ("num_layers", "hidden_size", "intermediate_size", "num_attention_heads", "patches_per_token"):
            value = getattr(self, name)
            if not _is_int(value) or value <= 0:
                raise ValueError(f"vision_encoder.{name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"vision_encoder.num_attention_heads must divide hidden_size "
                             f"({self.hidden_size}), got {self.num_attention_heads!r}")
        if self.tokens_per_image is not None and (not _is_int(self.tokens_per_image) or self.tokens_per_image <= 0):
            raise ValueError(f"vision_encoder.tokens_per_image must be a positive integer or None (dynamic "
                             f"resolution), got {self.tokens_per_image!r}")
        if not _is_int(self.projector_parameters) or self.projector_parameters < 0:
            raise ValueError(f"vision_encoder.projector_parameters must be an integer >= 0, "
                             f"got {self.projector_parameters!r}")
        if not isinstance(self.gated_mlp, bool):
            raise ValueError(f"vision_encoder.gated_mlp must be true or false, got {self.gated_mlp!r}")
        if self.window_tokens is not None and (not _is_int(self.window_tokens) or self.window_tokens <= 0):
            raise ValueError(f"vision_encoder.window_tokens must be a positive integer or None, got "
                             f"{self.window_tokens!r}")
        if not isinstance(self.images_whole, bool):
            raise ValueError(f"vision_encoder.images_whole must be true or false, got {self.images_whole!r}")
        if not _is_int(self.full_attention_layers) or not 0 <= self.full_attention_layers <= self.num_layers:
            raise ValueError(f"vision_encoder.full_attention_layers must be an integer in [0, num_layers "
                             f"{self.num_layers}], got {self.full_attention_layers!r}")

    @property
    def layer_linear_parameters(self) -> int:
        """One layer's matrices: q, k, v and the output projection, and the MLP's two (three if gated)."""
        mlp_matrices = 3 if self.gated_mlp else 2
        return 4 * self.hidden_size * self.hidden_size + mlp_matrices * self.hidden_size * self.intermediate_size

    @property
    def vision_tower_parameters(self) -> int:
        """The transformer layers' matrices (biases, norms, the patch and position embeddings left out: about
        1-3% of a tower, and none of its FLOPs that matter)."""
        return self.num_layers * self.layer_linear_parameters

    @property
    def num_parameters(self) -> int:
        """Approximate: the tower's matrices and the projector."""
        return self.vision_tower_parameters + self.projector_parameters

    def num_patches(self, num_encoder_tokens: int) -> int:
        return num_encoder_tokens * self.patches_per_token

    def linear_flops(self, num_encoder_tokens: int) -> int:
        """2 FLOPs per weight per row: every patch through every layer, every token through the projector."""
        return 2 * (self.num_patches(num_encoder_tokens) * self.vision_tower_parameters
                    + num_encoder_tokens * self.projector_parameters)

    def attention_flops(self, encoder_attention_work: int, num_encoder_tokens: int | None = None) -> int:
        """QK^T and AV over every pair of patches of the same image, 2 FLOPs per multiply-add each, in every
        layer. ``encoder_attention_work`` is the sum of each image's tokens squared; its patches' pairs are
        that times patches_per_token squared. A windowed encoder's other layers score pairs within a window only:
        each token against at most ``window_tokens`` (windows cut at an image's edge hold fewer, ignored), which
        needs ``num_encoder_tokens``."""
        full_layers, windowed_layers = self.num_layers, 0
        windowed_work = 0
        if self.window_tokens is not None:
            if num_encoder_tokens is None:
                raise ValueError(f"vision_encoder {self.name!r} attends within windows: its attention needs the "
                                 "encoder tokens too")
            full_layers, windowed_layers = self.full_attention_layers, self.num_layers - self.full_attention_layers
            windowed_work = min(encoder_attention_work, num_encoder_tokens * self.window_tokens)
        token_pairs = full_layers * encoder_attention_work + windowed_layers * windowed_work
        return 4 * self.hidden_size * token_pairs * self.patches_per_token ** 2

    def flops(self, num_encoder_tokens: int, encoder_attention_work: int) -> int:
        return self.linear_flops(num_encoder_tokens) + self.attention_flops(encoder_attention_work, num_encoder_tokens)

    def to_dict(self) -> dict:
        return asdict(self)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# Figures from the published Hugging Face configs (vision_config of each model's config.json).
#
# LLaVA-1.5 (llava-hf/llava-1.5-7b-hf): CLIP ViT-L/14 at 336 px, 24 layers, hidden 1024, intermediate 4096,
# 16 heads, 577 patches (24 x 24 and a CLS, ignored here). LLaVA reads the penultimate layer's features
# (vision_feature_layer -2), so vLLM builds and runs only 23 layers. Projector: two linears, 1024 -> 4096 (the
# LM's width) and 4096 -> 4096, with a GELU between. Tower: 289M for 23 layers (CLIP's 303M for 24 counts
# embeddings and norms too); projector 21M.
CLIP_VIT_L_336 = VisionEncoderShape(
    name="clip-vit-l-336", num_layers=23, hidden_size=1024, intermediate_size=4096, num_attention_heads=16,
    patches_per_token=1, tokens_per_image=576, projector_parameters=1024 * 4096 + 4096 * 4096)

# Gemma 3 4B/12B/27B (google/gemma-3-*-it): SigLIP so400m at 896 px, patch 14, so a 64 x 64 grid of 4096
# patches, 27 layers, hidden 1152, intermediate 4304, 16 heads; mm_tokens_per_image 256 (4 x 4 average
# pooling). Projector: one linear 1152 -> the LM's hidden size, which differs by model size; this preset holds
# Gemma-3-12B's (3840), and MODEL_VISION_ENCODERS gives each size its own. (The projector is ~0.1% of the
# encoder's FLOPs, so naming this preset for another size is off by that much.) Tower: 411M; the Gemma 3
# report's 417M adds the embeddings.
SIGLIP_SO400M_896 = VisionEncoderShape(
    name="siglip-so400m-896", num_layers=27, hidden_size=1152, intermediate_size=4304, num_attention_heads=16,
    patches_per_token=16, tokens_per_image=256, projector_parameters=1152 * 3840, images_whole=True)

# Qwen2-VL-7B (Qwen/Qwen2-VL-7B-Instruct): depth 32, embed_dim 1280, mlp_ratio 4 (5120), 16 heads, patch 14,
# spatial_merge_size 2 (four patches a token). Dynamic resolution: an image's tokens depend on its size. The
# merger: 4 x 1280 = 5120 -> 5120 -> 3584 (the LM's width). Tower 629M, merger 45M: the published 675M.
QWEN2_VL_VIT = VisionEncoderShape(
    name="qwen2-vl-vit", num_layers=32, hidden_size=1280, intermediate_size=5120, num_attention_heads=16,
    patches_per_token=4, tokens_per_image=None, projector_parameters=5120 * 5120 + 5120 * 3584)

# Qwen3-VL-8B (Qwen/Qwen3-VL-8B-Instruct): depth 27, hidden 1152, intermediate 4304 (a plain GELU MLP), 16 heads,
# patch 16, spatial_merge_size 2. The merger, 4 x 1152 = 4608 -> 4608 -> 4096 (the LM's width), and three DeepStack
# mergers of the same shape (deepstack_visual_indexes 8, 16, 24: features of those layers added to the LM's first
# layers). Tower 411M, mergers 160M; with Qwen3-8B's 8.19B, the published 8.77B less embeddings and norms.
QWEN3_VL_VIT = VisionEncoderShape(
    name="qwen3-vl-vit", num_layers=27, hidden_size=1152, intermediate_size=4304, num_attention_heads=16,
    patches_per_token=4, tokens_per_image=None, projector_parameters=4 * (4608 * 4608 + 4608 * 4096))

# The generated LLaVAs' CLIP towers (engine/models/default_vision_model.py; a test keeps them equal), run one layer
# short as LLaVA reads them: tiny 56 px in patches of 14 (16 tokens), 2 layers of 32; small 112 px (64 tokens), 4
# layers of 256. Projector: the tower's width -> the LM's (64 or 512) -> the LM's (biases not counted, as above).
SERVESIM_TINY_CLIP = VisionEncoderShape(
    name="servesim-tiny-clip", num_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2,
    patches_per_token=1, tokens_per_image=16, projector_parameters=32 * 64 + 64 * 64)
SERVESIM_SMALL_CLIP = VisionEncoderShape(
    name="servesim-small-clip", num_layers=3, hidden_size=256, intermediate_size=1024, num_attention_heads=4,
    patches_per_token=1, tokens_per_image=64, projector_parameters=256 * 512 + 512 * 512)

VISION_ENCODER_PRESETS: dict[str, VisionEncoderShape] = {
    encoder.name: encoder for encoder in (CLIP_VIT_L_336, SIGLIP_SO400M_896, QWEN2_VL_VIT, QWEN3_VL_VIT,
                                          SERVESIM_TINY_CLIP, SERVESIM_SMALL_CLIP)}

# Each multimodal LLM preset's own encoder (sim/model_presets.py). Gemma 3's projector maps into the text
# model's hidden size: 2560 (4B), 3840 (12B), 5376 (27B).
MODEL_VISION_ENCODERS: dict[str, VisionEncoderShape] = {
    "gemma-3-4b": replace(SIGLIP_SO400M_896, projector_parameters=1152 * 2560),
    "gemma-3-12b": SIGLIP_SO400M_896,
    "gemma-3-27b": replace(SIGLIP_SO400M_896, projector_parameters=1152 * 5376),
    "llava-1.5-7b": CLIP_VIT_L_336,
    "qwen2-vl-7b": QWEN2_VL_VIT,
    "qwen3-vl-8b": QWEN3_VL_VIT,
    "servesim-tiny-llava": SERVESIM_TINY_CLIP,
    "tiny-llava": SERVESIM_TINY_CLIP,
    "servesim-small-llava": SERVESIM_SMALL_CLIP,
    "small-llava": SERVESIM_SMALL_CLIP,
}

_FIELDS = {f.name: f for f in fields(VisionEncoderShape)}


def resolve_vision_encoder(model_name: str, spec: str | dict | VisionEncoderShape | None
                           ) -> VisionEncoderShape | None:
    """The vision encoder of a run: ``spec`` None, the model's own (None for a model without one); a string, a
    preset by name; a mapping, every field inline; a ``VisionEncoderShape``, as is."""
    if spec is None:
        return MODEL_VISION_ENCODERS.get(str(model_name).lower())
    if isinstance(spec, VisionEncoderShape):
        return spec
    if isinstance(spec, str):
        preset = VISION_ENCODER_PRESETS.get(spec.lower())
        if preset is None:
            raise ValueError(f"vision_encoder: unknown preset {spec!r}; presets: "
                             f"{', '.join(VISION_ENCODER_PRESETS)}")
        return preset
    if not isinstance(spec, dict):
        raise ValueError(f"vision_encoder: expected a preset name or a mapping, got {spec!r}")
    for key in spec:
        if key not in _FIELDS:
            raise ValueError(f"vision_encoder: unknown key {key!r} (known keys: {', '.join(_FIELDS)})")
    missing = [name for name, f in _FIELDS.items() if name not in spec and f.default is MISSING]
    if missing:
        raise ValueError(f"vision_encoder: missing {'keys' if len(missing) > 1 else 'key'} "
                         f"{', '.join(map(repr, missing))} (or name a preset: {', '.join(VISION_ENCODER_PRESETS)})")
    return VisionEncoderShape(**spec)
