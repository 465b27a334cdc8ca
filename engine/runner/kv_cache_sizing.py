"""How many KV blocks the pool gets: an explicit count, or a memory budget divided by a block's cost.

Budget, in order of precedence:
1. ``num_gpu_blocks`` given: exactly that many (tests use it to force preemption).
2. ``kv_cache_memory_bytes`` given: that many bytes.
3. CUDA: ``gpu_memory_utilization * total`` minus what is already in use after the weights were loaded
   (by this process or others) and minus an estimate of the forward pass's peak activations.
4. CPU: ``DEFAULT_CPU_KV_CACHE_BYTES``, capped at what ``max_num_seqs`` requests of ``max_model_len``
   tokens could ever hold (more blocks would only cost allocation time and host memory).

One block is the null block (never handed out), so the pool must have at least two.
"""

from __future__ import annotations

import torch

from engine.models.config import ModelConfig
from engine.runner.attention import kv_cache_bytes_per_block
from engine.runner.config import DEFAULT_CPU_KV_CACHE_BYTES


def estimate_activation_bytes(model_config: ModelConfig, max_num_batched_tokens: int, max_num_seqs: int,
                              dtype: torch.dtype) -> int:
    """A generous bound on one forward's live intermediates (we do not run a profiling pass)."""
    element = torch.empty((), dtype=dtype).element_size()
    per_token = (4 * model_config.hidden_size + 2 * model_config.intermediate_size
                 + (model_config.num_attention_heads + 2 * model_config.num_key_value_heads) * model_config.head_dim)
    logits = max_num_seqs * model_config.vocab_size * 4 * 3  # float32 logits, copy, probabilities
    return 2 * max_num_batched_tokens * per_token * element + logits


def determine_num_gpu_blocks(
    model_config: ModelConfig,
    *,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
    max_num_seqs: int,
    max_model_len: int,
    max_num_batched_tokens: int,
    num_gpu_blocks: int | None = None,
    kv_cache_memory_bytes: int | None = None,
    gpu_memory_utilization: float = 0.9,
    num_kv_cache_groups: int = 1,
    layers_per_block: int | None = None,
    extra_bytes_per_block: int = 0,
) -> int:
    """``layers_per_block`` and ``num_kv_cache_groups``: a hybrid KV cache's block holds one group's layers
    (engine/core/kv_cache_grouping.py), and a request holds a block per group for each block of tokens.
    ``extra_bytes_per_block``: what else each block id holds (a draft model's KV beside the target's)."""
    if num_gpu_blocks is not None:
        return num_gpu_blocks
    bytes_per_block = kv_cache_bytes_per_block(layers_per_block or model_config.num_hidden_layers, block_size,
                                               model_config.num_key_value_heads, model_config.head_dim, dtype,
                                               model_config.value_head_dim) + extra_bytes_per_block
    cap = None
    if kv_cache_memory_bytes is not None:
        budget = kv_cache_memory_bytes
        source = f"kv_cache_memory_bytes={kv_cache_memory_bytes}"
    elif device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        in_use = total - free
        activations = estimate_activation_bytes(model_config, max_num_batched_tokens, max_num_seqs, dtype)
        budget = int(gpu_memory_utilization * total) - in_use - activations
        source = (f"gpu_memory_utilization={gpu_memory_utilization} of {total / 2**30:.1f} GiB with "
                  f"{in_use / 2**30:.2f} GiB in use and {activations / 2**30:.2f} GiB kept for activations")
    else:
        budget = DEFAULT_CPU_KV_CACHE_BYTES
        source = f"the default CPU budget of {budget / 2**30:.1f} GiB"
        cap = max_num_seqs * -(-max_model_len // block_size) * num_kv_cache_groups + 1
    num_blocks = budget // bytes_per_block
    if cap is not None:
        num_blocks = min(num_blocks, cap)
    if num_blocks < 2:
        raise ValueError(f"the KV cache budget ({source}) holds {max(num_blocks, 0)} blocks of {bytes_per_block} "
                         "bytes; at least 2 are needed. Raise the budget or set num_gpu_blocks")
    return int(num_blocks)
