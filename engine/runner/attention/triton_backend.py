"""Triton backend: one unified paged-attention kernel for the whole mixed batch (``kernels/triton_*``).

Unlike the torch backend it never splits decodes from prefills on the host and reads no ``*_cpu``
metadata, so a step costs two kernel launches per layer (cache write, attention) whatever the batch
looks like, and a decode step can be captured in a CUDA graph (see ``engine/runner/cuda_graph_runner.py``).

The cache write uses the Triton ``reshape_and_cache`` on CUDA and the torch reference otherwise: on
CPU the kernels only run through Triton's interpreter (``TRITON_INTERPRET=1``), which exists for
testing, and the reference is both faster there and the definition the kernel is tested against.

triton is imported when the backend is created, never when the project is imported.
"""

from __future__ import annotations

import torch

from engine.runner.attention.backend import AttentionBackend
from engine.runner.attention.metadata import AttentionMetadata
from kernels.fp8 import Scale
from kernels.reshape_and_cache import reshape_and_cache
from kernels.triton_support import triton_unavailable_reason


class TritonAttentionBackend(AttentionBackend):
    name = "triton"
    supports_sinks = True
    supports_bidirectional_spans = True

    def __init__(self, k_scale: Scale = 1.0, v_scale: Scale = 1.0) -> None:
        """``k_scale``/``v_scale`` apply to an fp8 (float8_e4m3fn) cache only; see ``kernels/fp8.py``."""
        reason = triton_unavailable_reason()
        if reason is not None:
            raise RuntimeError(f"attention backend 'triton' cannot run here: {reason}; "
                               "use attention backend 'torch' instead")
        from kernels.triton_paged_attention import triton_paged_attention
        from kernels.triton_reshape_and_cache import triton_reshape_and_cache
        self._paged_attention = triton_paged_attention
        self._reshape_and_cache = triton_reshape_and_cache
        self.k_scale, self.v_scale = k_scale, v_scale

    def write_kv_cache(self, key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                       value_cache: torch.Tensor, metadata: AttentionMetadata) -> None:
        write = self._reshape_and_cache if key.is_cuda else reshape_and_cache
        write(key, value, key_cache, value_cache, metadata.slot_mapping, self.k_scale, self.v_scale)

    def attend(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
               metadata: AttentionMetadata, scale: float, output: torch.Tensor,
               sliding_window: int | None = None, logits_soft_cap: float | None = None,
               sinks: torch.Tensor | None = None) -> None:
        # Rows past the requests' tokens are left as the caller's zeros: the kernel only writes rows that
        # a request owns, and reads the device tensors only (no host sync, graph-capturable).
        self._paged_attention(query, key_cache, value_cache, output, metadata.query_start_loc, metadata.seq_lens,
                              metadata.block_table, scale, metadata.max_query_len, self.k_scale, self.v_scale,
                              sliding_window=sliding_window, logits_soft_cap=logits_soft_cap, sinks=sinks,
                              spans=token_spans(metadata))


def token_spans(metadata: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Per query token, the [start, end) of the span it attends both ways (end 0: none), int32 on the metadata's
    device, built once per step from ``bidirectional_spans`` (the host lists); None without spans."""
    if not metadata.bidirectional_spans or not any(metadata.bidirectional_spans):
        return None
    cached = metadata.__dict__.get("_token_spans")
    if cached is None:
        num_tokens = metadata.slot_mapping.shape[0]
        start, end = torch.zeros(num_tokens, dtype=torch.int32), torch.zeros(num_tokens, dtype=torch.int32)
        for req, spans in enumerate(metadata.bidirectional_spans):
            first_token, context_len = metadata.query_start_loc_cpu[req], metadata.num_computed_tokens_cpu[req]
            for low, high in spans:
                chunk_low, chunk_high = max(low, context_len), min(high, metadata.seq_lens_cpu[req])
                rows = slice(first_token + chunk_low - context_len, first_token + chunk_high - context_len)
                start[rows], end[rows] = low, high
        cached = metadata.__dict__["_token_spans"] = (start.to(metadata.device), end.to(metadata.device))
    return cached
