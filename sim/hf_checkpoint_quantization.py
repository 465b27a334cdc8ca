"""Which priced scheme (sim/weight_quantization.py) a checkpoint's weights are stored in, from its config.json's
``quantization_config``, as vLLM reads it to choose its kernels:

- ``quant_method: fp8`` (block-scaled as DeepSeek-V3 and Qwen3 -FP8, or per tensor): ``fp8``;
- ``quant_method: mxfp4`` (gpt-oss's experts): ``mxfp4``;
- ``gptq`` / ``awq`` (and their Marlin spellings) of 4 or 8 bits: ``w4a16`` / ``w8a16``;
- ``compressed-tensors`` (llm-compressor): its first config group's weights: float 8-bit ``fp8``, int 4-bit
  ``w4a16``, int 8-bit ``w8a16`` (a W8A8 checkpoint's int8 products are priced at the 16-bit rate: no int8 rate is
  modelled, so its compute is pessimistic and its bytes right).

Anything else (bitsandbytes, GGUF, NVFP4, ...) is refused by name rather than priced as 16-bit weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

_INTEGER_METHODS = ("gptq", "awq", "gptq_marlin", "awq_marlin")


def stored_quantization(config: dict[str, Any], path: Path) -> str | None:
    quantization = config.get("quantization_config")
    if not quantization:
        return None
    method = quantization.get("quant_method") if isinstance(quantization, dict) else None
    scheme = None
    if method in ("fp8", "mxfp4"):
        scheme = method
    elif method in _INTEGER_METHODS:
        scheme = {4: "w4a16", 8: "w8a16"}.get(quantization.get("bits"))
    elif method == "compressed-tensors":
        groups = quantization.get("config_groups") or {}
        weights = (next(iter(groups.values()), None) or {}).get("weights") or {}
        scheme = {("float", 8): "fp8", ("int", 4): "w4a16", ("int", 8): "w8a16"}.get(
            (weights.get("type", "int"), weights.get("num_bits")))
    if scheme is None:
        raise ValueError(f"model: {path}: quantization_config (quant_method {method!r}) stores weights in a way the "
                         "simulator does not price; priced: fp8, mxfp4, and 4- or 8-bit GPTQ, AWQ and "
                         "compressed-tensors integers")
    return scheme
