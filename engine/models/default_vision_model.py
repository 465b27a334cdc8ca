"""The offline default vision-language models: LLaVA checkpoints the project generates itself.

Each is the default Llama of the same size (engine/models/default_model.py: its config and weights, as the
language model) behind a small CLIP vision tower and LLaVA's two-layer projector, with weights from a fixed seed,
the tokenizer of the same recipe with ``<image>`` as its last id (the model's image token, and the placeholder
workloads put in prompts), a chat template that walks content parts as Hugging Face's LLaVA templates do, and a
CLIP ``preprocessor_config.json``. The folder is laid out as the Hub's LLaVA checkpoints are
(``language_model.model.``, ``vision_tower.vision_model.``, ``multi_modal_projector.``), so transformers reads it
too. Nothing is downloaded: the images of real runs and tests are drawn, not fetched.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

IMAGE_TOKEN = "<image>"
# Walks each message's content parts: an image part is the image token, a text part its text.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}{{ message['role'] }}:"
    "{% if message['content'] is string %} {{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>{% else %} {{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)

# size -> (the default Llama it builds on, its CLIP tower). Images of image_size pixels in patches of patch_size:
# (image_size / patch_size)^2 placeholder tokens each (tiny: 16, small: 64).
VISION_MODEL_SPECS: dict[str, dict[str, Any]] = {
    "tiny-llava": dict(text="tiny", vision=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                num_attention_heads=2, image_size=56, patch_size=14)),
    "small-llava": dict(text="small", vision=dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                                                  num_attention_heads=4, image_size=112, patch_size=14)),
}
_CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
_CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


def make_llava_model(folder: Path, text_spec: dict[str, Any], vision: dict[str, Any], seed: int) -> Path:
    """Write the LLaVA checkpoint of ``text_spec`` (a default Llama's make_test_model arguments) and ``vision`` (the
    CLIP tower's config) to ``folder``."""
    from engine.models.default_model import INIT_STD, make_test_model
    from engine.models.synthetic_tokenizer import train_tokenizer
    from engine.models.vision.llava import LlavaImageEncoder

    make_test_model(folder, **text_spec, seed=seed, with_tokenizer=False)
    text_config = json.loads((folder / "config.json").read_text())
    vocab_size = text_config["vocab_size"]
    config = {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava",
              "text_config": {key: value for key, value in text_config.items() if key != "architectures"},
              "vision_config": {**vision, "model_type": "clip_vision_model", "hidden_act": "quick_gelu",
                                "layer_norm_eps": 1e-5, "num_channels": 3},
              "image_token_index": vocab_size - 1, "vision_feature_layer": -2,
              "vision_feature_select_strategy": "default", "projector_hidden_act": "gelu",
              "multimodal_projector_bias": True, "tie_word_embeddings": False, "torch_dtype": "float32"}
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    text_weights = load_file(str(folder / "model.safetensors"))
    weights = {f"language_model.{name}": tensor for name, tensor in text_weights.items()}
    encoder = LlavaImageEncoder(config)
    generator = torch.Generator(device="cpu").manual_seed(seed + 1)
    for name, parameter in sorted(encoder.named_parameters()):
        # LayerNorms at their start (weight 1, bias 0), everything else drawn as the language model's weights are.
        is_norm = "norm" in name.split(".")[-2]
        value = (torch.ones if name.endswith("weight") else torch.zeros)(parameter.shape) if is_norm else \
            torch.empty(parameter.shape).normal_(0.0, INIT_STD, generator=generator)
        hub_name = name.replace("vision_tower.", "vision_tower.vision_model.", 1)
        weights[hub_name] = value.contiguous()
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})

    tokenizer = train_tokenizer(vocab_size - 1, text_config["max_position_embeddings"])
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    if tokenizer.convert_tokens_to_ids(IMAGE_TOKEN) != vocab_size - 1:
        raise RuntimeError(f"{IMAGE_TOKEN} did not get the vocabulary's last id {vocab_size - 1}")
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(str(folder))
    size = vision["image_size"]
    processor = {"image_processor_type": "CLIPImageProcessor", "do_resize": True, "size": {"shortest_edge": size},
                 "resample": 3, "do_center_crop": True, "crop_size": {"height": size, "width": size},
                 "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": _CLIP_MEAN,
                 "image_std": _CLIP_STD, "do_convert_rgb": True}
    (folder / "preprocessor_config.json").write_text(json.dumps(processor, indent=2) + "\n")
    return folder
