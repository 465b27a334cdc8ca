"""Multimodal checkpoints served as their language model: text in, text out (vLLM serves them so when no image
comes). The images of Gemma 3, InternVL, LLaVA, LLaVA-NeXT, LLaVA-OneVision, Qwen2-VL / Qwen2.5-VL / Qwen3-VL and
Mistral 3 checkpoints go through engine/models/vision/, beside it.

The published Gemma 3 (4B-27B), Mistral Small 3.1+ (``Mistral3ForConditionalGeneration``), LLaVA, Qwen2-VL /
Qwen2.5-VL / Qwen3-VL and Llama 4 checkpoints keep the language model's keys in ``text_config`` and its weights under ``language_model.`` (transformers
5's in-memory layout, ``model.language_model.``, too), beside a vision tower and a projector, which are not loaded.
``flatten`` turns the config into the language model's own (the architecture name stays the checkpoint's, which the
registry maps to the text model's class); ``text_weights`` renames the weights and drops the rest.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

# The checkpoint's architecture -> the text model_type it is served as (None: text_config's own model_type).
MULTIMODAL_ARCHITECTURES: dict[str, str | None] = {
    "Gemma3ForConditionalGeneration": "gemma3_text",
    "Mistral3ForConditionalGeneration": None,
    "LlavaForConditionalGeneration": None,
    "LlavaNextForConditionalGeneration": None,
    "LlavaOnevisionForConditionalGeneration": None,  # a Qwen2
    # InternVL3 / 3.5 in transformers' layout ("-hf" checkpoints): a Qwen2, Qwen3 or Llama in text_config.
    "InternVLForConditionalGeneration": None,
    "Llama4ForConditionalGeneration": "llama4_text",
    # Qwen2-VL / Qwen2.5-VL: a Qwen2 whose RoPE is M-RoPE, three position streams over sections of each head; for
    # text the three positions are equal, which is plain RoPE over the whole head.
    "Qwen2VLForConditionalGeneration": "qwen2",
    "Qwen2_5_VLForConditionalGeneration": "qwen2",
    # Qwen3-VL: a Qwen3 (q/k norms) with interleaved M-RoPE, plain RoPE for text too; its DeepStack adds visual
    # features to early layers only where images are.
    "Qwen3VLForConditionalGeneration": "qwen3",
    # Qwen3-VL-MoE (30B-A3B, 235B-A22B): the same over a Qwen3-MoE, whose top-k weights transformers always
    # renormalizes (its config has no norm_topk_prob).
    "Qwen3VLMoeForConditionalGeneration": "qwen3_moe",
}
_QWEN_VL = ("Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration", "Qwen3VLForConditionalGeneration",
            "Qwen3VLMoeForConditionalGeneration")
_NOT_TEXT = ("vision_tower.", "vision_model.", "multi_modal_projector.", "model.vision_tower.", "image_newline",
             "model.image_newline",
             "model.multi_modal_projector.", "visual.", "model.visual.")
# Keys of the outer config the language model reads too, where text_config has none.
_OUTER_KEYS = ("torch_dtype", "dtype", "quantization_config", "bos_token_id", "eos_token_id")


def is_multimodal(raw: dict[str, Any]) -> bool:
    return any(name in MULTIMODAL_ARCHITECTURES for name in raw.get("architectures") or [])


def flatten(raw: dict[str, Any]) -> dict[str, Any]:
    """The language model's config of a multimodal ``raw`` (``raw`` itself for a text checkpoint)."""
    architecture = next((name for name in raw.get("architectures") or [] if name in MULTIMODAL_ARCHITECTURES), None)
    if architecture is None:
        return raw
    text = raw.get("text_config")
    if architecture in _QWEN_VL:
        # Published Qwen2-VL / 2.5-VL configs keep the language model's keys at the top level; transformers 5 writes
        # a text_config, which wins.
        outer = {key: value for key, value in raw.items() if key not in ("text_config", "vision_config")}
        text = _plain_rope({**outer, **(text if isinstance(text, dict) else {})})
    if not isinstance(text, dict):
        raise ValueError(f"config.json: a {architecture} checkpoint needs its language model's keys in text_config, "
                         f"got {text!r}")
    model_type = MULTIMODAL_ARCHITECTURES[architecture] or text.get("model_type", "llama")
    if architecture == "Qwen3VLMoeForConditionalGeneration":
        text = {**text, "norm_topk_prob": True}
    outer = {key: raw[key] for key in _OUTER_KEYS if raw.get(key) is not None and text.get(key) is None}
    if raw.get("tie_word_embeddings") is not None:
        # transformers ties the head to the embedding by the outer config's word (Mistral 3's true beside its
        # text_config's false: the checkpoint then has no lm_head).
        outer["tie_word_embeddings"] = raw["tie_word_embeddings"]
    return {**text, **outer, "architectures": [architecture], "model_type": model_type}


def _plain_rope(text: dict[str, Any]) -> dict[str, Any]:
    """M-RoPE (``type: mrope`` or an ``mrope_section``) as the plain RoPE it is for text."""
    text = dict(text)
    for key in ("rope_scaling", "rope_parameters"):
        rope = text.get(key)
        if isinstance(rope, dict) and (rope.get("type") == "mrope" or rope.get("rope_type") == "mrope"
                                       or "mrope_section" in rope):
            plain = {name: value for name, value in rope.items()
                     if name not in ("type", "rope_type", "mrope_section", "mrope_interleaved")}
            text[key] = {**plain, "rope_type": "default"}
    return text


def text_weights(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """The language model's tensors under a text checkpoint's names; the vision tower's and projector's dropped."""
    for name, tensor in weights:
        if name.startswith(_NOT_TEXT):
            continue
        if name.startswith("model.language_model."):
            name = "model." + name.removeprefix("model.language_model.")
        yield name.removeprefix("language_model."), tensor
