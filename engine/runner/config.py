"""The runner's typed configuration, and the device / attention-backend / dtype defaults it resolves.

Defaults: device "cpu"; attention backend "torch" on CPU; on CUDA "flash_attn" when the package imports,
else "triton" when it can launch kernels, else "torch" (with a warning); dtype "auto" = the checkpoint's
dtype, except that a float32 checkpoint runs in bfloat16 under flash-attn (which has no float32 kernels).
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.runner.lora.config import LoRAConfig
from engine.runner.spec_decode.config import SpeculativeConfig

logger = logging.getLogger(__name__)

GIB = 1 << 30
# On the host there is nothing to measure free memory against; this is the default KV budget.
DEFAULT_CPU_KV_CACHE_BYTES = 1 * GIB


@dataclass(slots=True)
class RunnerConfig:
    model: str | Path
    dtype: str | torch.dtype = "auto"
    device: str = "cpu"
    attention_backend: str | None = None
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None  # None: the model's own limit
    num_gpu_blocks: int | None = None  # explicit pool size; wins over any memory budget
    kv_cache_memory_bytes: int | None = None  # explicit KV budget in bytes
    gpu_memory_utilization: float = 0.9  # CUDA only: fraction of the device the engine may fill
    seed: int = 0
    # vLLM's switch: True runs every step eagerly; False captures CUDA graphs for decode-only steps where
    # the device and attention backend allow it (engine/runner/decode_graphs.py).
    enforce_eager: bool = False
    cuda_graph_batch_sizes: list[int] | None = None  # None: 1, 2, 4, ... up to max_num_seqs
    # Eager steps pad their token count to a multiple of this (engine/runner/eager_shapes.py).
    # None: 64 on CUDA, 1 (no padding) on the CPU.
    eager_token_padding: int | None = None
    # Speculative decoding's proposer and its settings (engine/runner/spec_decode/); None: off.
    speculative_config: SpeculativeConfig | None = None
    # Multi-LoRA serving (engine/runner/lora/): adapter slots and the host cache; None: off.
    lora_config: LoRAConfig | None = None
    # An engine that only embeds (runner="pooling"): a checkpoint without an LM head loads (engine/models/loader.py).
    pooling: bool = False

    def __post_init__(self) -> None:
        def require(ok: bool, name: str, requirement: str) -> None:
            if not ok:
                raise ValueError(f"{name} must be {requirement}, got {getattr(self, name)!r}")

        require(isinstance(self.block_size, int) and self.block_size > 0, "block_size", "a positive integer")
        require(self.num_gpu_blocks is None or (isinstance(self.num_gpu_blocks, int) and self.num_gpu_blocks >= 2),
                "num_gpu_blocks", "None or an integer >= 2")
        require(self.kv_cache_memory_bytes is None
                or (isinstance(self.kv_cache_memory_bytes, int) and self.kv_cache_memory_bytes > 0),
                "kv_cache_memory_bytes", "None or a positive integer")
        require(0.0 < self.gpu_memory_utilization <= 1.0, "gpu_memory_utilization", "in (0, 1]")
        require(self.cuda_graph_batch_sizes is None
                or (len(self.cuda_graph_batch_sizes) > 0
                    and all(isinstance(n, int) and 1 <= n <= self.max_num_seqs for n in self.cuda_graph_batch_sizes)),
                "cuda_graph_batch_sizes", f"None or a non-empty list of integers in [1, max_num_seqs={self.max_num_seqs}]")
        require(self.eager_token_padding is None
                or (isinstance(self.eager_token_padding, int) and self.eager_token_padding >= 1),
                "eager_token_padding", "None or an integer >= 1")
        require(self.max_model_len is None or (isinstance(self.max_model_len, int) and self.max_model_len >= 1),
                "max_model_len", "None or an integer >= 1")


# Configuration errors (a device or backend this machine cannot give) are ValueErrors, like every other
# bad setting: the CLIs (sim.run, sim.validate, sim.retime, engine.serve) turn a ValueError into one
# "error: ..." line and exit code 2, where a RuntimeError would be a traceback.


def resolve_device(device: str | torch.device) -> torch.device:
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):  # torch's own message lists a dozen device types this engine lacks
        raise ValueError(f"device must be 'cpu' or 'cuda', got {str(device)!r}") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {str(device)!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(device)!r} was requested but CUDA is not available; use device='cpu'")
    return device


def flash_attn_importable() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def resolve_attention_backend(name: str | None, device: torch.device,
                              unsupported: Mapping[str, str] | None = None) -> str:
    """``unsupported``: the model class's ``unsupported_attention_backends`` (DeepSeek's latent attention runs on
    'torch' only, gpt-oss's sinks not on 'flash_attn'): refused when asked for, skipped by the default choice."""
    unsupported = unsupported or {}
    if name is not None:
        from engine.runner.attention.registry import check_backend_supports_model
        check_backend_supports_model(name, unsupported)
        from engine.runner.attention import available_attention_backends

        if name not in available_attention_backends():
            raise ValueError(f"attention_backend must be one of {available_attention_backends()}, got {name!r}")
        if name == "flash_attn" and device.type != "cuda":
            raise ValueError("attention_backend 'flash_attn' needs device='cuda'; use 'torch' on CPU")
        if name == "flash_attn" and not flash_attn_importable():
            raise ValueError("attention_backend 'flash_attn' was requested but the flash-attn package is not "
                             "installed (pip install 'servesim[gpu]'); use 'triton' or 'torch'")
        if name == "triton":
            from kernels.triton_support import triton_unavailable_reason

            reason = triton_unavailable_reason()
            if reason is not None:
                raise ValueError(f"attention_backend 'triton' cannot run here: {reason}; use 'torch'")
        return name
    if device.type != "cuda":
        return "torch"
    if flash_attn_importable() and "flash_attn" not in unsupported:
        return "flash_attn"
    from kernels.triton_support import triton_unavailable_reason

    reason = triton_unavailable_reason()
    if reason is None and "triton" not in unsupported:
        logger.info("using the triton attention backend on CUDA (flash-attn is not installed or cannot run the "
                    "model)")
        return "triton"
    if "triton" in unsupported:
        logger.info("using the torch attention backend on CUDA: %s", unsupported["triton"])
        return "torch"
    logger.warning("neither flash-attn nor triton can run here (%s); using the (slower) torch attention backend "
                   "on CUDA", reason)
    return "torch"


def resolve_runtime_dtype(requested: str | torch.dtype, checkpoint_dtype: torch.dtype, backend: str) -> torch.dtype:
    """The dtype to run in, given the loader's resolution of ``requested`` for this checkpoint."""
    if backend == "flash_attn" and checkpoint_dtype == torch.float32:
        if requested in (None, "auto"):
            return torch.bfloat16
        raise ValueError("attention_backend 'flash_attn' supports float16/bfloat16 only, got dtype float32")
    return checkpoint_dtype
