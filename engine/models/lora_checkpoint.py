"""Reading a LoRA adapter saved in PEFT's format, checked against the model it is meant for.

A folder holds ``adapter_config.json`` (``r``, ``lora_alpha``, ``target_modules``, ``use_rslora`` ...) and
``adapter_model.safetensors`` with, for each adapted projection of each layer,

    base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight    [r, in_features]
    base_model.model.model.layers.{i}.self_attn.q_proj.lora_B.weight    [out_features, r]

and the projection's output becomes ``W x + scale * B (A x)`` with ``scale = lora_alpha / r`` (``lora_alpha /
sqrt(r)`` with ``use_rslora``). The projections the runner adapts are the Llama family's seven linear
layers (q, k, v, o, gate, up, down); q/k/v and gate/up are slices of our fused ``qkv_proj`` and
``gate_up_proj`` (engine/runner/lora/lora_linear.py). An adapter of a checkpoint that stores them fused (Phi-3,
Phi-4: targets ``qkv_proj``, ``gate_up_proj``) is read as one adapter per slice, each with the fused A and its
rows of the fused B. Everything else PEFT can save (embeddings, the LM
head, DoRA's magnitudes, biases, fully trained ``modules_to_save``, per-module ranks) would change the
model in ways the runner does not reproduce, so it is refused: a ValueError naming the file, the field or
key, and the value, raised when the request is added, never in a step.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"

# PEFT's module name -> the decoder-layer submodule that holds it.
TARGET_MODULES = {
    "q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
    "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp",
    # Checkpoints that store these fused (Phi-3, Phi-4) are adapted fused: one A for all slices, one B with the
    # slices' rows stacked, which is the same update as one adapter per slice sharing A.
    "qkv_proj": "self_attn", "gate_up_proj": "mlp",
}
FUSED_TARGETS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
# A vision-language model's adapter names its language model's layers under ``language_model``: transformers 5's
# ``model.language_model.layers`` or the older ``language_model.model.layers`` (the image encoder's layers, which the
# runner does not adapt, are refused as any other key outside the decoder layers).
_KEY = re.compile(r"base_model\.model\.(?:model\.language_model\.|language_model\.model\.|model\.)layers\.(\d+)\."
                  r"(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight")


@dataclass(frozen=True, slots=True)
class LoRATargetShapes:
    """What an adapter must fit: the model's layer count and each target's (in_features, out_features)."""
    num_layers: int
    shapes: dict[str, tuple[int, int]]


@dataclass(slots=True)
class LoRAWeights:
    """One loaded adapter, in host memory: ``weights[(layer, module)] = (A [r, in], B [out, r])`` in float32,
    and the scale its B is multiplied by (kept apart: the device slots fold it in, in the model's dtype)."""
    rank: int
    scale: float
    target_modules: tuple[str, ...]
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    @property
    def num_bytes(self) -> int:
        return sum(a.numel() * a.element_size() + b.numel() * b.element_size() for a, b in self.weights.values())


def read_adapter(folder: str | Path, target_shapes: LoRATargetShapes, max_lora_rank: int) -> LoRAWeights:
    """The adapter in ``folder``, or a ValueError saying which file, field or key is wrong and why."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"LoRA adapter folder {str(folder)!r} does not exist")
    rank, scale, targets = _read_config(folder / CONFIG_FILE, max_lora_rank)
    adapter = LoRAWeights(rank, scale, adapted_projections(targets))
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    weights_path = folder / WEIGHTS_FILE
    for key, tensor in _read_tensors(weights_path):
        where = f"{weights_path}: key {key!r}"
        match = _KEY.fullmatch(key)
        if match is None:
            raise ValueError(f"{where} is not a LoRA A/B weight of a decoder layer's {'/'.join(TARGET_MODULES)}; "
                             "the runner adapts only those (no embeddings, LM head, DoRA, biases or "
                             "modules_to_save)")
        layer, parent, module, half = int(match[1]), match[2], match[3], match[4]
        if TARGET_MODULES.get(module) != parent:
            raise ValueError(f"{where}: module {module!r} is not one the runner adapts "
                             f"({', '.join(TARGET_MODULES)})")
        if module not in targets:
            raise ValueError(f"{where}: module {module!r} is not in {CONFIG_FILE}'s target_modules {list(targets)}")
        if layer >= target_shapes.num_layers:
            raise ValueError(f"{where}: layer {layer}, but the model has {target_shapes.num_layers} layers")
        if not tensor.is_floating_point():
            raise ValueError(f"{where} has dtype {tensor.dtype}, not a floating-point type")
        slices = FUSED_TARGETS.get(module, (module,))
        in_features = target_shapes.shapes[slices[0]][0]
        out_features = sum(target_shapes.shapes[name][1] for name in slices)
        expected = (rank, in_features) if half == "A" else (out_features, rank)
        if tuple(tensor.shape) != expected:
            raise ValueError(f"{where} has shape {tuple(tensor.shape)}, expected {expected} (r={rank}, the model's "
                             f"{module} maps {in_features} -> {out_features} features)")
        halves.setdefault((layer, module), {})[half] = tensor.to(torch.float32)
    for (layer, module), pair in sorted(halves.items()):
        if len(pair) != 2:
            missing = "lora_B" if "A" in pair else "lora_A"
            raise ValueError(f"{weights_path}: layer {layer}'s {module} has no {missing}.weight")
        start = 0
        for name in FUSED_TARGETS.get(module, (module,)):
            end = start + target_shapes.shapes[name][1]
            adapter.weights[(layer, name)] = (pair["A"], pair["B"][start:end])
            start = end
    if not adapter.weights:
        raise ValueError(f"{weights_path} holds no LoRA weights")
    return adapter


def _read_config(path: Path, max_lora_rank: int) -> tuple[int, float, tuple[str, ...]]:
    if not path.is_file():
        raise ValueError(f"LoRA adapter file {str(path)!r} does not exist (a PEFT adapter folder holds "
                         f"{CONFIG_FILE} and {WEIGHTS_FILE})")
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read {str(path)!r}: {error}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(config).__name__}")

    def bad(name: str, requirement: str) -> ValueError:
        return ValueError(f"{path}: field {name!r} must be {requirement}, got {config.get(name)!r}")

    peft_type = config.get("peft_type", "LORA")
    if peft_type != "LORA":
        raise bad("peft_type", "'LORA'")
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise bad("r", "an integer >= 1")
    if rank > max_lora_rank:
        raise ValueError(f"{path}: field 'r' is {rank}, more than max_lora_rank {max_lora_rank} (raise "
                         "max_lora_rank / --max-lora-rank)")
    alpha = config.get("lora_alpha", 8)  # PEFT's default
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha <= 0:
        raise bad("lora_alpha", "a positive number")
    use_rslora = config.get("use_rslora", False)
    if not isinstance(use_rslora, bool):
        raise bad("use_rslora", "true or false")
    if config.get("bias", "none") != "none":
        raise bad("bias", "'none' (trained biases are not supported)")
    if config.get("use_dora", False) is not False:
        raise bad("use_dora", "false (DoRA is not supported)")
    if config.get("fan_in_fan_out", False) is not False:
        raise bad("fan_in_fan_out", "false")
    for name in ("modules_to_save", "rank_pattern", "alpha_pattern"):
        if config.get(name):
            raise bad(name, "empty or null (the runner adapts the target modules with one r and lora_alpha only)")
    targets = config.get("target_modules")
    if isinstance(targets, str):
        targets = [targets]  # PEFT reads a string as a pattern; a bare module name is the only one accepted here
    if not isinstance(targets, list) or not targets or not all(isinstance(name, str) for name in targets):
        raise bad("target_modules", f"a non-empty list of module names from {list(TARGET_MODULES)}")
    unknown = [name for name in targets if name not in TARGET_MODULES]
    if unknown:
        raise ValueError(f"{path}: field 'target_modules' names {unknown}; the runner adapts only "
                         f"{list(TARGET_MODULES)} (not embed_tokens or lm_head)")
    scale = alpha / math.sqrt(rank) if use_rslora else alpha / rank
    return rank, float(scale), tuple(dict.fromkeys(targets))


def adapted_projections(targets: tuple[str, ...]) -> tuple[str, ...]:
    """The unfused projections ``targets`` adapt (a fused target adapts each of its slices)."""
    return tuple(dict.fromkeys(name for target in targets for name in FUSED_TARGETS.get(target, (target,))))


def _read_tensors(path: Path):
    if not path.is_file():
        legacy = path.with_name("adapter_model.bin")
        hint = (f"; it has {legacy.name}, a pickle this runner does not read (save with safe_serialization=True)"
                if legacy.is_file() else "")
        raise ValueError(f"LoRA adapter file {str(path)!r} does not exist{hint}")
    from safetensors import safe_open

    try:
        reader_context = safe_open(str(path), framework="pt", device="cpu")
    except Exception as error:  # safetensors' own error names no file
        raise ValueError(f"cannot read LoRA adapter file {str(path)!r}: {error}") from None
    with reader_context as reader:
        for key in reader.keys():
            yield key, reader.get_tensor(key)
