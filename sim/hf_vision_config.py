"""A vision-language model's Hugging Face ``config.json``: the language model's config inside it, flattened into
the text config sim/hf_model_config.py reads, and the vision encoder's shape (sim/vision_encoders.py).

Four families, as their checkpoints save them:

- Gemma 3 (``Gemma3ForConditionalGeneration``): the LM in ``text_config`` (a ``gemma3_text`` config), a SigLIP
  ViT in ``vision_config``, the pooled tokens per image (``mm_tokens_per_image``) at the top level;
- LLaVA (``LlavaForConditionalGeneration``): the LM in ``text_config`` (Llama for LLaVA-1.5, Mistral for
  BakLLaVA), a CLIP ViT in ``vision_config``, the layer whose features the LM reads (``vision_feature_layer``)
  at the top level;
- LLaVA-NeXT (``LlavaNextForConditionalGeneration``, LLaVA-1.6): LLaVA's keys, with ``image_grid_pinpoints`` for
  its tiles; LLaVA-OneVision (``LlavaOnevisionForConditionalGeneration``) the same with a Qwen2 LM and a SigLIP ViT;
- Qwen2-VL and Qwen2.5-VL: the LM's keys at the top level, as a Qwen2 config's (newer transformers may save
  them under ``text_config``), the ViT and its merger in ``vision_config``;
- Mistral 3 (``Mistral3ForConditionalGeneration``, Mistral Small 3.1+): a Mistral LM in ``text_config``, a Pixtral
  ViT (gated MLP, dynamic resolution) in ``vision_config``, the patch merger's ``spatial_merge_size`` at the top
  level;
- Qwen3-VL (``Qwen3VLForConditionalGeneration``, and ``Qwen3VLMoeForConditionalGeneration`` whose LM is a Qwen3
  mixture of experts): the LM in ``text_config`` (its M-RoPE is plain RoPE for text), a ViT with a plain GELU MLP,
  its merger and the DeepStack mergers (one per ``deepstack_visual_indexes`` entry, feeding intermediate ViT
  features into the LM's first layers) in ``vision_config``;
- InternVL3 / 3.5 in transformers' layout (``InternVLForConditionalGeneration``): a Qwen2, Qwen3 or Llama LM in
  ``text_config``, InternViT over 448-pixel tiles in ``vision_config``, the pixel shuffle's ``downsample_ratio`` at
  the top level.

A checkpoint's ``text_config`` holds only the keys that differ from its config class's defaults (LLaVA-1.5-7B's
holds seven), so the defaults of transformers' config classes fill in the rest, as transformers does on loading.
A vision config gets no such defaults: the classes' defaults describe other encoders (SigLIP-base for Gemma 3,
CLIP-B/32 for LLaVA), so a key left out is refused by name rather than priced as another model.

Imports no torch (the simulator runs without it).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from sim.hf_config_file import read_config_json
from sim.vision_encoders import VisionEncoderShape

GEMMA3 = "Gemma3ForConditionalGeneration"
LLAVA = "LlavaForConditionalGeneration"
QWEN2_VL = "Qwen2VLForConditionalGeneration"
QWEN2_5_VL = "Qwen2_5_VLForConditionalGeneration"
MISTRAL3 = "Mistral3ForConditionalGeneration"
QWEN3_VL = "Qwen3VLForConditionalGeneration"
QWEN3_VL_MOE = "Qwen3VLMoeForConditionalGeneration"
INTERNVL = "InternVLForConditionalGeneration"
LLAVA_NEXT = "LlavaNextForConditionalGeneration"
LLAVA_ONEVISION = "LlavaOnevisionForConditionalGeneration"
VISION_LANGUAGE_ARCHITECTURES = (GEMMA3, LLAVA, QWEN2_VL, QWEN2_5_VL, MISTRAL3, QWEN3_VL, QWEN3_VL_MOE, INTERNVL,
                                 LLAVA_NEXT, LLAVA_ONEVISION)
_ARCHITECTURE_OF_MODEL_TYPE = {"gemma3": GEMMA3, "llava": LLAVA, "qwen2_vl": QWEN2_VL, "qwen2_5_vl": QWEN2_5_VL,
                               "mistral3": MISTRAL3, "qwen3_vl": QWEN3_VL, "qwen3_vl_moe": QWEN3_VL_MOE,
                               "internvl": INTERNVL, "llava_next": LLAVA_NEXT, "llava_onevision": LLAVA_ONEVISION}
# transformers' Qwen3VLTextConfig defaults (and Qwen3VLMoeTextConfig's expert keys), for keys a text_config leaves
# out; each with the architecture its language model reads as.
_QWEN3_VL_TEXT_DEFAULTS = {"hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
                           "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128,
                           "max_position_embeddings": 128000, "vocab_size": 151936}
_QWEN3_VL_TEXT_MODELS = {
    QWEN3_VL: ("Qwen3ForCausalLM", "qwen3", _QWEN3_VL_TEXT_DEFAULTS),
    QWEN3_VL_MOE: ("Qwen3MoeForCausalLM", "qwen3_moe",
                   {**_QWEN3_VL_TEXT_DEFAULTS, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 24,
                    "num_attention_heads": 16, "num_key_value_heads": 16, "num_experts": 60, "num_experts_per_tok": 4,
                    "moe_intermediate_size": 1408, "decoder_sparse_step": 1, "mlp_only_layers": []}),
}
# transformers' Mistral3Config's default text_config (Mistral Small 3.1's).
_MISTRAL3_TEXT_DEFAULTS = {"hidden_size": 5120, "intermediate_size": 32768, "num_hidden_layers": 40,
                           "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                           "max_position_embeddings": 131072, "vocab_size": 131072, "sliding_window": None}

# transformers' Gemma3TextConfig defaults: what a Gemma 3 checkpoint's text_config leaves out (every released
# size's vocab_size and max_position_embeddings, the 4B's head counts).
_GEMMA3_TEXT_DEFAULTS = {"hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                         "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 262208,
                         "sliding_window": 4096, "max_position_embeddings": 131072, "tie_word_embeddings": True}
# transformers' LlamaConfig defaults (num_key_value_heads: num_attention_heads, which hf_model_config assumes
# already) and MistralConfig defaults, for LLaVA's text_config; each with the architecture it reads as.
_LLAVA_TEXT_MODELS = {
    "llama": ("LlamaForCausalLM", {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                                   "num_attention_heads": 32, "max_position_embeddings": 2048, "vocab_size": 32000}),
    "mistral": ("MistralForCausalLM", {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                                       "num_attention_heads": 32, "num_key_value_heads": 8,
                                       "max_position_embeddings": 4096 * 32, "vocab_size": 32000,
                                       "sliding_window": 4096}),
}
# transformers' Qwen2Config and Qwen3Config defaults, for InternVL's and LLaVA-OneVision's text_config (a Qwen2 by
# default, InternVL3's and OneVision's; InternVL3.5's a Qwen3); a Llama reads as LLaVA's does.
_QWEN_TEXT_DEFAULTS = {"hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
                       "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 32768,
                       "vocab_size": 151936}
_QWEN_OR_LLAMA_TEXT_MODELS = {
    "qwen2": ("Qwen2ForCausalLM", _QWEN_TEXT_DEFAULTS),
    "qwen3": ("Qwen3ForCausalLM", {**_QWEN_TEXT_DEFAULTS, "head_dim": 128}),
    "llama": _LLAVA_TEXT_MODELS["llama"],
}
# What a config may leave out at its top level: LlavaConfig's and Gemma3Config's defaults.
_DEFAULT_VISION_FEATURE_LAYER = -2
_DEFAULT_GEMMA3_TOKENS_PER_IMAGE = 256


def vision_language_architecture(config: dict) -> str | None:
    """The config's vision-language architecture, by ``architectures`` or (that left out) ``model_type``, as
    hf_model_config picks a text architecture; None for any other config."""
    architectures = config.get("architectures") or [_ARCHITECTURE_OF_MODEL_TYPE.get(config.get("model_type"))]
    return next((a for a in architectures if a in VISION_LANGUAGE_ARCHITECTURES), None)


def language_model_config(config: dict, path: str | Path) -> dict | None:
    """The language model's config of a vision-language ``config``, flat, as a text checkpoint's config.json
    would hold it (None for a text-only config). Its ``architectures`` names the LM's architecture, so that
    hf_model_config dispatches on it; ``_name_or_path`` is the outer config's (a LLaVA text_config carries its
    base model's, Vicuna's, which is not this model)."""
    architecture = vision_language_architecture(config)
    if architecture is None:
        return None
    text = config.get("text_config")
    if text is None:
        text = {}  # transformers' config classes build the default text config then
    if not isinstance(text, dict):
        raise ValueError(f"model: {path}: key 'text_config' must be a mapping, got {text!r}")
    if architecture in (QWEN2_VL, QWEN2_5_VL):
        # The LM's keys sit at the top level; a text_config, where saved, holds the same keys and wins.
        outer = {key: value for key, value in config.items() if key not in ("text_config", "vision_config")}
        language = {**outer, **text, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}
    else:
        if architecture == GEMMA3:
            text_architecture, text_model_type, defaults = "Gemma3ForCausalLM", "gemma3_text", _GEMMA3_TEXT_DEFAULTS
        elif architecture in _QWEN3_VL_TEXT_MODELS:
            text_architecture, text_model_type, defaults = _QWEN3_VL_TEXT_MODELS[architecture]
        elif architecture == MISTRAL3:
            text_architecture, text_model_type, defaults = "MistralForCausalLM", "mistral", _MISTRAL3_TEXT_DEFAULTS
        elif architecture in (INTERNVL, LLAVA_ONEVISION):
            text_model_type = text.get("model_type", "qwen2")  # both config classes' default text config is Qwen2's
            if text_model_type not in _QWEN_OR_LLAMA_TEXT_MODELS:
                raise ValueError(f"model: {path}: key 'text_config.model_type' is {text_model_type!r}; its "
                                 f"language model is read for {', '.join(_QWEN_OR_LLAMA_TEXT_MODELS)}")
            text_architecture, defaults = _QWEN_OR_LLAMA_TEXT_MODELS[text_model_type]
        else:
            text_model_type = text.get("model_type", "llama")  # LlavaConfig's default text config is Llama's
            if text_model_type not in _LLAVA_TEXT_MODELS:
                raise ValueError(f"model: {path}: key 'text_config.model_type' is {text_model_type!r}; LLaVA's "
                                 f"language model is read for {', '.join(_LLAVA_TEXT_MODELS)}")
            text_architecture, defaults = _LLAVA_TEXT_MODELS[text_model_type]
            if "vocab_size" in config:
                # Older LlavaConfigs kept the LM's vocabulary at the top level.
                defaults = {**defaults, "vocab_size": config["vocab_size"]}
        # The text config's own tie_word_embeddings first, then the outer config's, then the class default.
        outer_tie = {"tie_word_embeddings": config["tie_word_embeddings"]} if "tie_word_embeddings" in config else {}
        language = {**defaults, **outer_tie, **text, "architectures": [text_architecture],
                    "model_type": text_model_type}
        if architecture in (MISTRAL3, QWEN3_VL, QWEN3_VL_MOE, INTERNVL):
            # transformers ties Mistral 3's and Qwen3-VL's head by the outer config (true beside a text_config's
            # false: its checkpoints then hold no lm_head), as the engine reads it (engine/models/multimodal_text.py).
            language.update(outer_tie)
    language.pop("_name_or_path", None)
    if config.get("_name_or_path"):
        language["_name_or_path"] = config["_name_or_path"]
    return language


def vision_encoder_from_hf_config(config: dict, language_hidden_size: int, path: str | Path
                                  ) -> VisionEncoderShape | None:
    """The vision encoder of a vision-language ``config`` (None for a text-only config), its projector mapping
    into ``language_hidden_size``; a ValueError naming the key for a malformed ``vision_config``."""
    architecture = vision_language_architecture(config)
    if architecture is None:
        return None
    vision = config.get("vision_config")
    if vision is None:
        raise ValueError(f"model: {path}: config.json lacks the key 'vision_config' ({architecture})")
    if not isinstance(vision, dict):
        raise ValueError(f"model: {path}: key 'vision_config' must be a mapping, got {vision!r}")
    path = Path(path)
    name = f"{config.get('_name_or_path') or path.parent.name or path.stem} vision"
    read = {GEMMA3: _gemma3_siglip, LLAVA: _llava_clip, QWEN2_VL: _qwen2_vl_vit, QWEN2_5_VL: _qwen2_5_vl_vit,
            MISTRAL3: _mistral3_pixtral, QWEN3_VL: _qwen3_vl_vit, QWEN3_VL_MOE: _qwen3_vl_vit,
            INTERNVL: _internvl_vit, LLAVA_NEXT: _llava_next_clip, LLAVA_ONEVISION: _llava_onevision_siglip}
    return read[architecture](name, config, vision, language_hidden_size, path)


def vision_encoder_from_hf_path(path: str | Path) -> VisionEncoderShape | None:
    """The vision encoder of the model whose ``config.json`` is ``path`` (or lies in the folder ``path``). None
    when ``path`` names no such file (a preset name, say) or the config is a text model's."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        return None
    config = read_config_json(path)
    language = language_model_config(config, path)
    if language is None:
        return None
    return vision_encoder_from_hf_config(config, _positive(language, "hidden_size", "", path), path)


def _positive(section: dict, key: str, where: str, path: Path, default: int | None = None) -> int:
    """``section[key]`` (``default`` when left out), a positive integer; ``where`` is the section's dotted
    prefix in error messages ("vision_config." or "" for the top level)."""
    raw = section.get(key, default)
    if raw is None:
        section_name = where.rstrip(".") or "config.json"
        raise ValueError(f"model: {path}: {section_name} lacks the key {key!r}")
    if not isinstance(raw, int) or isinstance(raw, bool) or raw < 1:
        raise ValueError(f"model: {path}: key '{where}{key}' must be a positive integer, got {raw!r}")
    return raw


def _vision(vision: dict, key: str, path: Path) -> int:
    return _positive(vision, key, "vision_config.", path)


def _patch_grid_side(vision: dict, path: Path) -> int:
    """Patches along one side of the (square) input image."""
    image_size, patch_size = _vision(vision, "image_size", path), _vision(vision, "patch_size", path)
    if image_size % patch_size:
        raise ValueError(f"model: {path}: key 'vision_config.patch_size' ({patch_size}) must divide "
                         f"vision_config.image_size ({image_size})")
    return image_size // patch_size


def _gemma3_siglip(name: str, config: dict, vision: dict, language_hidden_size: int, path: Path
                   ) -> VisionEncoderShape:
    """SigLIP at a fixed resolution; average pooling turns its patch grid into ``mm_tokens_per_image`` tokens
    (4096 patches into 256 at 896 px), which one linear maps into the LM's width. The LM attends among an image's
    tokens both ways: each image is prefilled whole."""
    patches = _patch_grid_side(vision, path) ** 2
    tokens = _positive(config, "mm_tokens_per_image", "", path, _DEFAULT_GEMMA3_TOKENS_PER_IMAGE)
    if patches % tokens:
        raise ValueError(f"model: {path}: key 'mm_tokens_per_image' ({tokens}) must divide the image's {patches} "
                         "patches (vision_config.image_size / patch_size, squared)")
    hidden_size = _vision(vision, "hidden_size", path)
    return VisionEncoderShape(
        name=name, num_layers=_vision(vision, "num_hidden_layers", path), hidden_size=hidden_size,
        intermediate_size=_vision(vision, "intermediate_size", path),
        num_attention_heads=_vision(vision, "num_attention_heads", path), patches_per_token=patches // tokens,
        tokens_per_image=tokens, projector_parameters=hidden_size * language_hidden_size, images_whole=True)


def _llava_clip(name: str, config: dict, vision: dict, language_hidden_size: int, path: Path,
                grid_side: int | None = None) -> VisionEncoderShape:
    """CLIP at a fixed resolution, one token a patch. The LM reads the features of layer
    ``vision_feature_layer`` (counting the embeddings as 0, so -2 is the penultimate layer), and the server runs
    no layer past it; ``vision_feature_select_strategy`` "default" drops the CLS patch, "full" keeps it. The
    projector: two linears (vision width, times the layers read, to the LM's width; then the LM's width to
    itself) with a GELU between."""
    num_layers = _vision(vision, "num_hidden_layers", path)
    feature_layer = config.get("vision_feature_layer", _DEFAULT_VISION_FEATURE_LAYER)
    # Newer LlavaConfigs accept a list of layers, whose features are concatenated.
    feature_layers = feature_layer if isinstance(feature_layer, list) and feature_layer else [feature_layer]
    depths = []
    for layer in feature_layers:
        depth = num_layers + 1 + layer if _is_int(layer) and layer < 0 else layer
        if not _is_int(layer) or not 1 <= depth <= num_layers:
            raise ValueError(f"model: {path}: key 'vision_feature_layer' must name a layer of the "
                             f"{num_layers} (1..{num_layers}, or -1..-{num_layers} from the last), got {feature_layer!r}")
        depths.append(depth)
    strategy = config.get("vision_feature_select_strategy", "default")
    if strategy not in ("default", "full"):
        raise ValueError(f"model: {path}: key 'vision_feature_select_strategy' must be 'default' or 'full', "
                         f"got {strategy!r}")
    hidden_size = _vision(vision, "hidden_size", path)
    return VisionEncoderShape(
        name=name, num_layers=max(depths), hidden_size=hidden_size,
        intermediate_size=_vision(vision, "intermediate_size", path),
        num_attention_heads=_vision(vision, "num_attention_heads", path), patches_per_token=1,
        tokens_per_image=(grid_side or _patch_grid_side(vision, path)) ** 2 + (strategy == "full"),
        projector_parameters=(hidden_size * len(depths) * language_hidden_size
                              + language_hidden_size * language_hidden_size))


def _llava_next_clip(name: str, config: dict, vision: dict, language_hidden_size: int, path: Path
                     ) -> VisionEncoderShape:
    """LLaVA-1.5's CLIP and projector over "any resolution" tiles (the workload states each image's tokens: a base
    tile's and the unpadded grid's, a newline a row); attention within a tile, so each tile is a window."""
    shape = _llava_clip(name, config, vision, language_hidden_size, path)
    if config.get("vision_feature_select_strategy", "default") != "default":
        raise ValueError(f"model: {path}: key 'vision_feature_select_strategy' must be 'default' for LLaVA-NeXT")
    return replace(shape, tokens_per_image=None, window_tokens=shape.tokens_per_image)


def _llava_onevision_siglip(name: str, config: dict, vision: dict, language_hidden_size: int, path: Path
                           ) -> VisionEncoderShape:
    """LLaVA-NeXT's tiles through a SigLIP tower (its last layer's features by default, every patch kept; the grid's
    map shrunk past ``vision_aspect_ratio``): the workload states each image's tokens."""
    # SigLIP-so400m at 384 pixels cuts 27 patches of 14 a side: its convolution drops the remainder.
    side = _vision(vision, "image_size", path) // _vision(vision, "patch_size", path)
    shape = _llava_clip(name, {"vision_feature_layer": -1, **config}, vision, language_hidden_size, path, side)
    return replace(shape, tokens_per_image=None, window_tokens=side ** 2)


def _qwen2_vl_vit(name: str, config: dict, vision: dict, language_hidden_size: int, path: Path
                  ) -> VisionEncoderShape:
    """Qwen2-VL's ViT at dynamic resolution (the workload states each image's tokens). Its merger concatenates
    each ``spatial_merge_size`` squared block of patches into one token, then two linears: the concatenated width
    to itself, and to the LM's width. (The config's vision_config.hidden_size is that LM width, not the ViT's:
    the ViT's is ``embed_dim``.)"""
    embed_dim = _vision(vision, "embed_dim", path)
    mlp_ratio = vision.get("mlp_ratio")
    if mlp_ratio is None:
        raise ValueError(f"model: {path}: vision_config lacks the key 'mlp_ratio'")
    # A number (4 in every release, 4.0 as some tools save it) that makes the MLP a whole width.
    is_number = isinstance(mlp_ratio, (int, float)) and not isinstance(mlp_ratio, bool)
    intermediate = embed_dim * mlp_ratio if is_number else 0
    if intermediate <= 0 or intermediate != int(intermediate):
        raise ValueError(f"model: {path}: key 'vision_config.mlp_ratio' must be a positive number that makes "
                         f"embed_dim ({embed_dim}) times it a whole width, got {mlp_ratio!r}")
    merge = _vision(vision, "spatial_merge_size", path)
    merged_width = embed_dim * merge * merge
    return VisionEncoderShape(
        name=name, num_layers=_vision(vision, "depth", path), hidden_size=embed_dim,
        intermediate_size=int(intermediate), num_attention_heads=_vision(vision, "num_heads", path),
        patches_per_token=merge * merge, tokens_per_image=None,
        projector_parameters=merged_width * merged_width + merged_width * language_hidden_size)


def _qwen2_5_vl_vit(name: str, config: dict, vision: dict, language_hidden_size: int, path: Path
                    ) -> VisionEncoderShape:
    """Qwen2.5-VL's ViT: Qwen2-VL's, with a gated (SwiGLU) MLP and the merger's output width its own key
    (``out_hidden_size``, the LM's width). Its layers attend within windows of the image (``window_size`` pixels a
    side: 112, so 4 x 4 merged tokens) but for a few (``fullatt_block_indexes``), as the engine's tower does
    (engine/models/vision/qwen2_5_vl.py)."""
    hidden_size = _vision(vision, "hidden_size", path)
    merge = _vision(vision, "spatial_merge_size", path)
    merged_width = hidden_size * merge * merge
    return VisionEncoderShape(
        name=name, num_layers=_vision(vision, "depth", path), hidden_size=hidden_size,
        intermediate_size=_vision(vision, "intermediate_size", path),
        num_attention_heads=_vision(vision, "num_heads", path), patches_per_token=merge * merge,
        tokens_per_image=None,
        projector_parameters=merged_width * merged_width + merged_width * _vision(vision, "out_hidden_size", path),
        gated_mlp=True, window_tokens=(int(vision.get("window_size", 112)) // (_vision(vision, "patch_size", path)
                                                                               * merge)) ** 2,
        full_attention_layers=len(vision.get("fullatt_block_indexes") or []))


def _mistral3_pixtral(name: str, config: dict, vision: dict, language_hidden_size: int, path: Path
                      ) -> VisionEncoderShape:
    """Mistral 3's Pixtral ViT at dynamic resolution (the workload states each image's tokens), with a gated MLP.
    Its projector: the patch merger concatenates each ``spatial_merge_size`` squared block of patches and maps it
    back to the ViT's width, then two linears, to the LM's width and to itself."""
    hidden_size = _vision(vision, "hidden_size", path)
    merge = _positive(config, "spatial_merge_size", "", path, 2)
    return VisionEncoderShape(
        name=name, num_layers=_vision(vision, "num_hidden_layers", path), hidden_size=hidden_size,
        intermediate_size=_vision(vision, "intermediate_size", path),
        num_attention_heads=_vision(vision, "num_attention_heads", path), patches_per_token=merge * merge,
        tokens_per_image=None,
        projector_parameters=(hidden_size * merge * merge * hidden_size + hidden_size * language_hidden_size
                              + language_hidden_size * language_hidden_size),
        gated_mlp=True)


def _qwen3_vl_vit(name: str, config: dict, vision: dict, language_hidden_size: int, path: Path
                  ) -> VisionEncoderShape:
    """Qwen3-VL's ViT at dynamic resolution, with a plain GELU MLP. Its merger concatenates each
    ``spatial_merge_size`` squared block of patches, then two linears: the concatenated width to itself, and to
    ``out_hidden_size`` (the LM's width); each DeepStack merger, one per ``deepstack_visual_indexes`` entry, has
    the same shape and runs on the same tokens."""
    hidden_size = _vision(vision, "hidden_size", path)
    merge = _vision(vision, "spatial_merge_size", path)
    merged_width = hidden_size * merge * merge
    deepstack = vision.get("deepstack_visual_indexes")
    if not isinstance(deepstack, list) or not all(_is_int(index) for index in deepstack):
        raise ValueError(f"model: {path}: key 'vision_config.deepstack_visual_indexes' must be a list of layer "
                         f"indexes, got {deepstack!r}")
    merger = merged_width * merged_width + merged_width * _vision(vision, "out_hidden_size", path)
    return VisionEncoderShape(
        name=name, num_layers=_vision(vision, "depth", path), hidden_size=hidden_size,
        intermediate_size=_vision(vision, "intermediate_size", path),
        num_attention_heads=_vision(vision, "num_heads", path), patches_per_token=merge * merge,
        tokens_per_image=None, projector_parameters=(1 + len(deepstack)) * merger)


def _internvl_vit(name: str, config: dict, vision: dict, language_hidden_size: int, path: Path
                  ) -> VisionEncoderShape:
    """InternViT over 448-pixel tiles (the workload states each image's tokens: 256 a tile, as many tiles as the
    image's shape gives); attention within a tile, so each tile is a window of its tokens' patches. The pixel shuffle
    joins ``1 / downsample_ratio`` squared patches into a token; the projector: a LayerNorm and two linears (the
    shuffled width to the LM's, the LM's to itself)."""
    def square(key: str) -> int:
        value = vision.get(key)
        if isinstance(value, list) and len(value) == 2 and value[0] == value[1]:
            value = value[0]
        if not _is_int(value) or value < 1:
            raise ValueError(f"model: {path}: key 'vision_config.{key}' must be a positive integer or a square "
                             f"[height, width], got {value!r}")
        return value

    side, patch = square("image_size"), square("patch_size")
    ratio = config.get("downsample_ratio", 0.5)
    shuffle = round(1 / ratio) if isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and ratio > 0 else 0
    if side % patch or not shuffle or abs(shuffle * ratio - 1) > 1e-6 or (side // patch) % shuffle:
        raise ValueError(f"model: {path}: key 'downsample_ratio' must be 1 / n for an n that divides the tile's "
                         f"patches a side (vision_config.image_size / patch_size), got {ratio!r}")
    hidden_size = _vision(vision, "hidden_size", path)
    shuffled = hidden_size * shuffle * shuffle
    return VisionEncoderShape(
        name=name, num_layers=_vision(vision, "num_hidden_layers", path), hidden_size=hidden_size,
        intermediate_size=_vision(vision, "intermediate_size", path),
        num_attention_heads=_vision(vision, "num_attention_heads", path), patches_per_token=shuffle * shuffle,
        tokens_per_image=None, window_tokens=(side // patch // shuffle) ** 2,
        projector_parameters=shuffled * language_hidden_size + language_hidden_size * language_hidden_size)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
