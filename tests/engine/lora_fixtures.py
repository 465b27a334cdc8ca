"""LoRA adapters for the generated models, and transformers references with an adapter merged in by hand.

The reference is independent of the runner's LoRA code: transformers' own model, whose projection weights
become ``W + scale * B @ A`` (scale = lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora), read
straight from the adapter's files.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file

from engine.models.make_lora import make_lora_adapter

# Two adapters that differ in rank, targets and scaling rule.
ADAPTER_SPECS = {
    "alpha": dict(rank=8, alpha=16, seed=0),  # all seven projections
    "beta": dict(rank=4, alpha=8, seed=1, use_rslora=True, targets=("q_proj", "v_proj", "o_proj", "up_proj",
                                                                     "down_proj")),
}


def make_adapters(folder: Path, model_path: Path) -> dict[str, Path]:
    return {name: make_lora_adapter(folder / name, model_path, **spec) for name, spec in ADAPTER_SPECS.items()}


def merged_hf_model(hf_model, adapter_dir: Path):
    """A copy of transformers' model with the adapter merged into its weights (W + scale * B @ A)."""
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    rank, alpha = config["r"], config["lora_alpha"]
    scale = alpha / math.sqrt(rank) if config["use_rslora"] else alpha / rank
    tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
    merged = copy.deepcopy(hf_model)
    modules = dict(merged.named_modules())
    with torch.no_grad():
        for key, lora_a in tensors.items():
            if ".lora_A." not in key:
                continue
            lora_b = tensors[key.replace(".lora_A.", ".lora_B.")]
            module_name = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
            modules[module_name].weight += scale * (lora_b @ lora_a)
    return merged.eval()
