"""Writes compressed-tensors checkpoints the way llm-compressor does, with the compressed-tensors library itself:
a small random model, min-max scales for each weight scheme (the library's own calculate_qparams), then the
library's compressor and config writer. The loader under test never sees this code; what it reads is the library's
format."""

from __future__ import annotations

import json
from pathlib import Path

import torch


def write_compressed_checkpoint(path: Path, source: Path, weights: dict, input_activations: dict | None = None,
                                storage_format: str = "pack-quantized", ignore=("lm_head",),
                                targets=("Linear",)) -> Path:
    """The checkpoint at ``source`` quantized by one config group (``weights``: QuantizationArgs fields) and saved to
    ``path`` in ``storage_format``."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (QuantizationArgs, QuantizationConfig, QuantizationScheme,
                                                 apply_quantization_config)
    from compressed_tensors.quantization.utils import calculate_qparams
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32)
    scheme = QuantizationScheme(targets=list(targets), weights=QuantizationArgs(**weights),
                                input_activations=QuantizationArgs(**input_activations) if input_activations else None)
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=list(ignore)))
    for module in model.modules():
        args = getattr(getattr(module, "quantization_scheme", None), "weights", None)
        if args is None:
            continue
        low, high = _ranges(module.weight.data, args)
        scale, zero_point = calculate_qparams(low, high, args)
        module.weight_scale.data.copy_(scale.reshape(module.weight_scale.shape).to(module.weight_scale.dtype))
        if hasattr(module, "weight_zero_point"):
            module.weight_zero_point.data.copy_(zero_point.reshape(module.weight_zero_point.shape)
                                                .to(module.weight_zero_point.dtype))
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format=storage_format)
    compressor.compress_model(model)
    model.save_pretrained(str(path))
    compressor.update_config(str(path))
    return path


def _ranges(weight: torch.Tensor, args) -> tuple[torch.Tensor, torch.Tensor]:
    """Each scale's (min, max) over the weights it covers (a block past the edge covers zeros, which the range
    includes anyway)."""
    if args.strategy == "tensor":
        return weight.amin().reshape(1), weight.amax().reshape(1)
    if args.strategy == "channel":
        return weight.amin(-1, keepdim=True), weight.amax(-1, keepdim=True)
    if args.strategy == "group":
        grouped = weight.unflatten(-1, (-1, args.group_size))
        return grouped.amin(-1), grouped.amax(-1)
    block_rows, block_columns = args.block_structure
    rows, columns = weight.shape
    padded = torch.nn.functional.pad(weight, (0, -columns % block_columns, 0, -rows % block_rows))
    blocks = padded.unflatten(0, (-1, block_rows)).unflatten(-1, (-1, block_columns))
    return blocks.amin((1, 3)), blocks.amax((1, 3))


def edit_quantization_config(path: Path, **changes) -> None:
    """Change keys of the checkpoint's quantization_config: ``a__b`` is group 0's ``a.b``, ``group__b`` group 0's
    ``b``."""
    config_file = Path(path) / "config.json"
    config = json.loads(config_file.read_text())
    quantization = config["quantization_config"]
    for key, value in changes.items():
        target, *rest = key.split("__")
        if target == "group":
            quantization["config_groups"]["group_0"][rest[0]] = value
        elif rest:
            quantization["config_groups"]["group_0"].setdefault(target, {})
            quantization["config_groups"]["group_0"][target][rest[0]] = value
        else:
            quantization[target] = value
    config_file.write_text(json.dumps(config))
