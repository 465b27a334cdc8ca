"""Checkpoints in the compressed-tensors format (``quantization_config.quant_method: compressed-tensors``), the one
vLLM's llm-compressor writes and vLLM serves natively: the ``-quantized.w4a16`` / ``-quantized.w8a16`` (GPTQ and AWQ
weights), ``-FP8-dynamic`` / ``-FP8`` and ``-quantized.w8a8`` models. Dequantized at load.

A quantized linear ``X`` is stored, by format:
- ``pack-quantized``: ``X.weight_packed`` int32 [N, ceil(K * b / 32)], the b-bit codes (b = 2, 4 or 8) of each row
  stored from the lowest bits up, each plus 2^(b-1) so that it is unsigned; ``X.weight_shape`` = [N, K]; an
  asymmetric ``X.weight_zero_point`` packed the same way along its first dimension;
- ``int-quantized`` / ``naive-quantized`` / ``float-quantized``: ``X.weight`` as int8 or float8 (E4M3) codes, and an
  asymmetric ``X.weight_zero_point`` as it is;
with ``X.weight_scale`` by the group's strategy: one for the tensor, one per row (channel) [N, 1], one per row and
group of ``group_size`` columns [N, K / group_size] (an old GPTQ ``actorder: group`` checkpoint maps each column to its
group with ``X.weight_g_idx``), or one per block [ceil(N / bn), ceil(K / bk)]. The weight is ``(code - zero_point) *
scale``, formed in the scale's dtype as compressed-tensors forms it, then cast to the model's dtype.

Activations run unquantized, as transformers runs these checkpoints (vLLM quantizes them per token on GPUs with
fp8 / int8 tensor cores; the simulator prices that: sim/weight_quantization.py), so a ``dynamic`` input scheme is
accepted and a static one (calibrated ``input_scale`` tensors) refused, as for block FP8. Each refusal names the key.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

UNPACKED_FORMATS = ("int-quantized", "naive-quantized", "float-quantized")
FORMATS = ("pack-quantized", *UNPACKED_FORMATS)
STRATEGIES = ("tensor", "channel", "group", "block")
# Tensors that belong to a quantized linear X, by the suffix after "X.".
PARTS = ("weight_packed", "weight_shape", "weight_scale", "weight_zero_point", "weight_g_idx")


@dataclass(frozen=True)
class WeightScheme:
    """How one config group stores its weights."""

    num_bits: int
    kind: str  # "int" or "float"
    symmetric: bool
    strategy: str
    group_size: int | None
    block: tuple[int, int] | None
    format: str
    with_group_index: bool  # GPTQ's actorder "group": a weight_g_idx tensor per linear


@dataclass(frozen=True)
class CompressedTensorsConfig:
    groups: tuple[tuple[tuple[str, ...], WeightScheme], ...]  # (targets, scheme), first match wins

    def scheme_of(self, module: str) -> WeightScheme:
        for targets, scheme in self.groups:
            if any(_matches(target, module) for target in targets):
                return scheme
        raise ValueError(f"checkpoint stores {module!r} quantized, but no quantization_config.config_groups entry "
                         f"targets it (targets: {[targets for targets, _ in self.groups]})")


def _matches(target: str, module: str) -> bool:
    """compressed-tensors' targets: ``re:`` + a regex matched from the start of the module's name, a module name, or a
    class name; every quantized tensor here belongs to a linear layer, so ``Linear`` (any class name) matches all."""
    if target.startswith("re:"):
        return re.match(target[3:], module) is not None
    return target == module or module.endswith("." + target) or ("." not in target and target[:1].isupper())


def parse_compressed_tensors(quantization: dict[str, Any]) -> CompressedTensorsConfig | None:
    """The weight schemes of a compressed-tensors ``quantization_config``; None for another method."""
    if quantization.get("quant_method") != "compressed-tensors":
        return None
    where = "config.json: quantization_config"
    for key in ("sparsity_config", "transform_config"):
        if quantization.get(key):
            raise ValueError(f"{where}.{key} is not supported (sparse and rotated weights); only quantized ones are")
    groups = quantization.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise ValueError(f"{where}.config_groups must name at least one group, got {groups!r}")
    parsed = []
    for name, group in groups.items():
        targets = group.get("targets") if isinstance(group, dict) else None
        if not isinstance(targets, list) or not all(isinstance(target, str) for target in targets):
            raise ValueError(f"{where}.config_groups.{name}.targets must be a list of names, got {targets!r}")
        parsed.append((tuple(targets), _weight_scheme(group, quantization.get("format"), f"{where}.config_groups.{name}")))
    return CompressedTensorsConfig(groups=tuple(parsed))


def _weight_scheme(group: dict[str, Any], default_format: Any, where: str) -> WeightScheme:
    weights = group.get("weights")
    if not isinstance(weights, dict):
        raise ValueError(f"{where}.weights is {weights!r}: only groups that quantize weights are supported")
    activations = group.get("input_activations")
    if activations and not activations.get("dynamic"):
        raise ValueError(f"{where}.input_activations is static (calibrated input scales), which is not supported; "
                         "dynamic input quantization is (activations then run unquantized)")
    if group.get("output_activations"):
        raise ValueError(f"{where}.output_activations is not supported")
    storage = group.get("format") or default_format
    if storage not in FORMATS:
        raise ValueError(f"{where}: format {storage!r} is not supported; supported: {', '.join(FORMATS)}")
    kind, bits, strategy = weights.get("type", "int"), weights.get("num_bits"), weights.get("strategy")
    supported_bits = (2, 4, 8) if kind == "int" else (8,)
    if kind not in ("int", "float") or bits not in supported_bits:
        raise ValueError(f"{where}.weights: {kind} weights of {bits!r} bits are not supported (int 2, 4 or 8 bits; "
                         "float 8 bits, E4M3); NVFP4 and MXFP4 groups are not")
    if strategy not in STRATEGIES:
        raise ValueError(f"{where}.weights.strategy {strategy!r} is not supported; supported: {', '.join(STRATEGIES)}")
    if storage == "pack-quantized" and kind != "int" or storage != "pack-quantized" and bits != 8:
        raise ValueError(f"{where}: {kind} weights of {bits} bits cannot be stored in format {storage!r} (int weights "
                         "are packed, or stored as int8 at 8 bits; float8 ones stored as they are)")
    group_size, block = weights.get("group_size"), weights.get("block_structure")
    if strategy == "group" and not (isinstance(group_size, int) and group_size > 0):
        raise ValueError(f"{where}.weights.group_size must be a positive integer for strategy group, got {group_size!r}")
    if strategy == "block" and not (isinstance(block, list) and len(block) == 2
                                    and all(isinstance(size, int) and size > 0 for size in block)):
        raise ValueError(f"{where}.weights.block_structure must be two positive integers, got {block!r}")
    return WeightScheme(num_bits=bits, kind=kind, symmetric=bool(weights.get("symmetric", True)), strategy=strategy,
                        group_size=group_size if strategy == "group" else None,
                        block=tuple(block) if strategy == "block" else None, format=storage,
                        with_group_index=weights.get("actorder") == "group")


def unpack_codes(packed: torch.Tensor, num_bits: int, length: int) -> torch.Tensor:
    """int32 words [..., W] -> signed codes [..., length] (int32): code i of a row sits at bits num_bits * i of the
    row's little-endian bit string, plus 2^(num_bits - 1)."""
    per_word = 32 // num_bits
    shifts = torch.arange(per_word, dtype=torch.int32) * num_bits
    codes = (packed.unsqueeze(-1) >> shifts) & ((1 << num_bits) - 1)  # >> of a negative word: the mask drops its sign
    return codes.flatten(-2)[..., :length] - (1 << (num_bits - 1))


def dequantize(parts: dict[str, torch.Tensor], scheme: WeightScheme, module: str, dtype: torch.dtype) -> torch.Tensor:
    """The float weight of ``module`` from its stored parts (module docstring)."""
    scale = parts["weight_scale"]
    if scheme.format == "pack-quantized":
        shape = tuple(int(size) for size in parts["weight_shape"].tolist())
        codes = unpack_codes(parts["weight_packed"], scheme.num_bits, shape[-1]).reshape(shape)
    else:
        codes = parts["weight"]
        shape = tuple(codes.shape)
    value = codes.to(scale.dtype)
    zero_point = parts.get("weight_zero_point")
    if zero_point is not None:
        if scheme.format == "pack-quantized" and scheme.strategy in ("group", "channel"):  # packed along rows
            zero_point = unpack_codes(zero_point.transpose(-1, -2), scheme.num_bits, shape[-2]).transpose(-1, -2)
        zero_point = _expand(zero_point.to(scale.dtype), scheme, shape, parts.get("weight_g_idx"), module)
        value = value - zero_point
    return (value * _expand(scale, scheme, shape, parts.get("weight_g_idx"), module)).to(dtype)


def _expand(per_group: torch.Tensor, scheme: WeightScheme, shape: tuple[int, ...], group_index: torch.Tensor | None,
            module: str) -> torch.Tensor:
    """A scale (or zero point) broadcast to every element of the weight."""
    rows, columns = shape[-2:]
    if scheme.strategy == "tensor":
        return per_group.reshape(-1)[0] if per_group.numel() == 1 else _shape_error(module, per_group, "one value")
    if scheme.strategy == "channel":
        return per_group.reshape(*shape[:-1], 1)
    if scheme.strategy == "group":
        if group_index is not None:
            return per_group[..., group_index.long()]
        if columns % scheme.group_size:
            raise ValueError(f"{module}: {columns} input columns are not a multiple of group_size {scheme.group_size}")
        if per_group.shape[-1] != columns // scheme.group_size:
            _shape_error(module, per_group, f"{columns // scheme.group_size} groups a row")
        return per_group.repeat_interleave(scheme.group_size, dim=-1)
    block_rows, block_columns = scheme.block
    expanded = per_group.repeat_interleave(block_rows, dim=-2)[..., :rows, :]
    return expanded.repeat_interleave(block_columns, dim=-1)[..., :columns]


def _shape_error(module: str, tensor: torch.Tensor, expected: str):
    raise ValueError(f"{module}: a scale of shape {tuple(tensor.shape)}, but its strategy needs {expected}")


def dequantized_compressed_weights(weights: Iterable[tuple[str, torch.Tensor]], config: CompressedTensorsConfig,
                                   dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors with each quantized linear's parts (in any order, in any shard) replaced by its
    dequantized ``X.weight`` as soon as all of them have been read; a linear left incomplete is named in an error."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in weights:
        module, _, part = name.rpartition(".")
        if part == "input_scale":
            raise ValueError(f"checkpoint tensor {name!r}: static input scales are not supported")
        if part in ("k_scale", "v_scale"):
            continue  # an FP8 KV cache's scales: the cache here keeps the model's dtype
        if part not in PARTS and not (part == "weight" and _is_code(tensor)):
            yield name, tensor
            continue
        scheme = config.scheme_of(module)
        if part == "weight_zero_point" and scheme.symmetric:
            continue  # all zeros where written at all
        parts = pending.setdefault(module, {})
        parts[part] = tensor
        if _complete(parts, scheme):
            yield f"{module}.weight", dequantize(pending.pop(module), scheme, module, dtype)
    if pending:
        module, parts = next(iter(pending.items()))
        raise ValueError(f"checkpoint's quantized {module!r} is incomplete: it has {sorted(parts)}")


def _is_code(tensor: torch.Tensor) -> bool:
    return tensor.dtype == torch.int8 or tensor.dtype in {getattr(torch, name) for name in
                                                          ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, name)}


def _complete(parts: dict[str, torch.Tensor], scheme: WeightScheme) -> bool:
    needed = {"weight_packed", "weight_shape"} if scheme.format == "pack-quantized" else {"weight"}
    needed.add("weight_scale")
    if not scheme.symmetric:
        needed.add("weight_zero_point")
    if scheme.with_group_index:
        needed.add("weight_g_idx")
    return needed <= parts.keys()
