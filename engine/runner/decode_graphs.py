"""CUDA graphs for the model runner's decode-only steps (vLLM captures the same way; ``enforce_eager`` off).

A decode step of a small model on a GPU is bound by kernel launches, not by arithmetic: a few hundred
launches per step, each a few microseconds of host time. ``DecodeGraphs`` captures the model's forward
(embedding, every layer, final norm) once per size of a batch-size ladder and replays the smallest
graph that fits; the logits and the sampler stay eager (one matmul and a handful of small kernels).

When graphs are used, and why not otherwise:
- only on CUDA, only when ``enforce_eager`` is off;
- only with the ``triton`` attention backend: its kernels read device tensors alone, so a captured
  launch stays valid for any context length. The ``torch`` backend groups decodes by length on the
  host and ``flash_attn`` gathers contiguous K/V with host-sized tensors; both run eagerly;
- only for steps where every scheduled request has one query token and the batch fits the ladder.

The padding contract is ``engine/runner/cuda_graph_runner.py``'s: padded rows write to slot -1 (nothing) and
own no query tokens, so they change no cache entry and no real row's output.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import torch

from engine.runner.attention import AttentionMetadata, KVCache
from engine.runner.prepare_inputs import PreparedInputs
from engine.runner.cuda_graph_runner import DecodeCudaGraphRunner, decode_input_specs

logger = logging.getLogger(__name__)

CAPTURE_SAFE_BACKENDS = ("triton",)


def cuda_graphs_unavailable_reason(device: torch.device, attention_backend: str, enforce_eager: bool,
                                   model_reason: str | None = None) -> str | None:
    """Why decode steps run eagerly on this configuration, or None when they are captured. ``model_reason``
    is the model's own (``cuda_graph_unsafe_reason``: a forward whose control flow depends on the data)."""
    if enforce_eager:
        return "enforce_eager is set"
    if device.type != "cuda":
        return f"device is {device.type}, graphs need CUDA"
    if attention_backend not in CAPTURE_SAFE_BACKENDS:
        return (f"attention backend {attention_backend!r} reads host-side metadata; capture-safe backends: "
                f"{', '.join(CAPTURE_SAFE_BACKENDS)}")
    return model_reason


class DecodeGraphs:
    """The model's forward for decode-only steps, replayed from captured graphs.

    ``emulate=True`` runs the padded forward eagerly through the same static buffers (no capture): the
    CPU tests use it to check that padding changes nothing.
    """

    def __init__(self, model: torch.nn.Module, kv_caches: Sequence[KVCache], *, max_num_reqs: int,
                 max_num_blocks_per_req: int, max_model_len: int, device: torch.device,
                 batch_size_ladder: Sequence[int] | None = None, emulate: bool = False,
                 num_kv_cache_groups: int = 1) -> None:
        """``num_kv_cache_groups``: a hybrid KV cache's groups, each with its own static block table and slots."""
        self.model = model
        self.kv_caches = list(kv_caches)
        self.max_model_len = max_model_len
        self.device = device
        self.num_kv_cache_groups = num_kv_cache_groups
        self.graph_runner = DecodeCudaGraphRunner(
            self._forward, max_num_reqs,
            decode_input_specs(max_num_blocks_per_req, num_kv_cache_groups=num_kv_cache_groups), batch_size_ladder,
            device=device, emulate=emulate)

    @property
    def max_batch_size(self) -> int:
        return self.graph_runner.ladder[-1]

    @property
    def captured_sizes(self) -> list[int]:
        return self.graph_runner.captured_sizes

    def capture(self) -> None:
        with torch.inference_mode():
            self.graph_runner.capture()
        if not self.graph_runner.emulate:
            logger.info("captured CUDA graphs for decode batch sizes %s", self.captured_sizes)

    def _forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The model over padded static views. Host-side metadata is fixed, as replay requires."""
        padded = inputs["input_ids"].shape[0]
        def group_metadata(suffix: str) -> AttentionMetadata:
            return AttentionMetadata(
                num_actual_tokens=padded, query_start_loc=inputs["query_start_loc"], seq_lens=inputs["seq_lens"],
                block_table=inputs["block_table" + suffix], slot_mapping=inputs["slot_mapping" + suffix],
                max_query_len=1, max_seq_len=self.max_model_len, query_start_loc_cpu=[], seq_lens_cpu=[])

        metadata = group_metadata("")
        if self.num_kv_cache_groups > 1:  # each group's layers read its own table (backend.GroupKVCache)
            metadata.groups = [metadata] + [group_metadata(f"_{group}") for group in range(1, self.num_kv_cache_groups)]
        return self.model(inputs["input_ids"], inputs["positions"], self.kv_caches, metadata)

    def handles(self, prepared: PreparedInputs) -> bool:
        """True for a decode-only step (one query token per request) that fits the largest graph."""
        common = prepared.common
        return (bool(self.captured_sizes) and common.max_query_len == 1
                and common.num_actual_tokens == common.num_reqs <= self.max_batch_size)

    def forward(self, prepared: PreparedInputs, block_table_rows: np.ndarray | Sequence[np.ndarray]) -> torch.Tensor:
        """Hidden states [num_reqs, hidden_size] for a step ``handles`` accepted.

        ``block_table_rows`` is the persistent table's full-width rows for the step's requests (the graphs
        were captured for the full width; the per-step metadata keeps only the columns in use); with a hybrid
        KV cache, one such array per group.
        """
        common = prepared.common
        tables = list(block_table_rows) if self.num_kv_cache_groups > 1 else [block_table_rows]
        inputs = {
            "input_ids": torch.from_numpy(prepared.input_ids),
            "positions": torch.from_numpy(prepared.positions),
            "slot_mapping": torch.from_numpy(common.slot_mapping),
            "seq_lens": torch.from_numpy(common.seq_lens),
            "query_start_loc": torch.from_numpy(common.query_start_loc),
            "block_table": torch.from_numpy(np.ascontiguousarray(tables[0], dtype=np.int32)),
        }
        for group in range(1, self.num_kv_cache_groups):
            inputs[f"slot_mapping_{group}"] = torch.from_numpy(prepared.group_commons[group].slot_mapping)
            inputs[f"block_table_{group}"] = torch.from_numpy(np.ascontiguousarray(tables[group], dtype=np.int32))
        return self.graph_runner.run(common.num_reqs, inputs)
