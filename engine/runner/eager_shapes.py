"""Few, known matrix shapes for the steps that run eagerly on a GPU: token padding and a shape warm-up.

Measured on an H200 (real runs of the small model, bfloat16): a step whose token count the process
has not seen before takes 1 to 2.4 ms longer than a step of a similar, already seen count, because the
matrix library chooses a kernel for each new shape. Decode-only steps replay CUDA graphs and never pay
it; every step with a prefill chunk has a token count of its own and paid it again and again, which
made step time depend on history no cost model can see.

So, as vLLM pads to its capture sizes, an eager step on CUDA pads its flat token dimension up to a
multiple of ``padding`` (padded tokens write to slot -1 and belong to no request: the backends skip
them), and the runner runs every padded size once before serving. On the CPU there is no such
per-shape cost and padding would only add work, so the multiple is 1 there.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from engine.runner.attention import AttentionMetadata
from engine.runner.prepare_inputs import CommonAttentionMetadata
from kernels.reshape_and_cache import PADDING_SLOT_ID

DEFAULT_CUDA_TOKEN_PADDING = 64


def resolve_token_padding(requested: int | None, device: torch.device) -> int:
    """The multiple eager steps pad to: ``requested``, or 64 on CUDA and 1 (no padding) elsewhere."""
    if requested is not None:
        return requested
    return DEFAULT_CUDA_TOKEN_PADDING if device.type == "cuda" else 1


def padded_token_count(num_tokens: int, padding: int) -> int:
    return -(-num_tokens // padding) * padding


def pad_step_inputs(input_ids: np.ndarray, positions: np.ndarray, common: CommonAttentionMetadata,
                    padding: int) -> tuple[np.ndarray, np.ndarray, CommonAttentionMetadata]:
    """input_ids and positions padded with 0, slot_mapping with -1; the real counts stay as they are."""
    num_tokens = len(input_ids)
    extra = padded_token_count(num_tokens, padding) - num_tokens
    if extra == 0:
        return input_ids, positions, common
    zeros = np.zeros(extra, dtype=input_ids.dtype)
    slots = np.concatenate([common.slot_mapping, np.full(extra, PADDING_SLOT_ID, dtype=common.slot_mapping.dtype)])
    return (np.concatenate([input_ids, zeros]), np.concatenate([positions, zeros.astype(positions.dtype)]),
            dataclasses.replace(common, slot_mapping=slots))


@torch.inference_mode()
def warm_up_shapes(model, kv_caches, device: torch.device, *, max_num_tokens: int, padding: int,
                   max_num_reqs: int) -> int:
    """Run the model once at every padded token count up to ``max_num_tokens``, and the logits at every
    row count up to ``max_num_reqs``, with inputs that own no slot (nothing is written to the cache).
    Returns the number of forward passes run."""
    empty = torch.zeros(0, dtype=torch.int32, device=device)
    runs = 0
    for num_tokens in range(padding, padded_token_count(max_num_tokens, padding) + 1, padding):
        metadata = AttentionMetadata(
            num_actual_tokens=0, query_start_loc=torch.zeros(1, dtype=torch.int32, device=device), seq_lens=empty,
            block_table=torch.zeros((0, 1), dtype=torch.int32, device=device),
            slot_mapping=torch.full((num_tokens,), PADDING_SLOT_ID, dtype=torch.long, device=device),
            max_query_len=0, max_seq_len=0, query_start_loc_cpu=[0], seq_lens_cpu=[])
        metadata.local = metadata  # no request: chunked layers (Llama 4) attend nothing either
        ids = torch.zeros(num_tokens, dtype=torch.long, device=device)
        hidden_states = model(ids, ids, kv_caches, metadata)
        runs += 1
    for num_rows in range(1, max_num_reqs + 1):
        model.compute_logits(hidden_states[:1].expand(num_rows, -1).contiguous())
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return runs
