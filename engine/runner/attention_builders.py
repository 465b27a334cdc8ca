"""Per-backend attention metadata builders: CommonAttentionMetadata -> what the backend reads (5.1.3).

The common metadata is computed once per step on the host; each builder copies what its backend
needs to the device. Both of our backends read ``AttentionMetadata``; they differ in what is worth
precomputing: the torch backend splits decodes from prefills (done lazily on the metadata and shared
by every layer), flash-attn additionally needs ``cu_seqlens_k`` (``seq_start_loc``).
"""

from __future__ import annotations

import numpy as np
import torch

from engine.runner.attention import AttentionMetadata
from engine.runner.prepare_inputs import CommonAttentionMetadata


class AttentionMetadataBuilder:
    """Builds the torch backend's metadata; the base for other backends."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def _to_device(self, array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        # from_numpy shares memory; .to() copies to the device, or converts dtype on the host.
        tensor = torch.from_numpy(np.ascontiguousarray(array))
        return tensor.to(device=self.device, dtype=dtype, non_blocking=True)

    def build(self, common: CommonAttentionMetadata) -> AttentionMetadata:
        return AttentionMetadata(
            num_actual_tokens=common.num_actual_tokens,
            query_start_loc=self._to_device(common.query_start_loc, torch.int32),
            seq_lens=self._to_device(common.seq_lens, torch.int32),
            block_table=self._to_device(common.block_table, torch.int32),
            slot_mapping=self._to_device(common.slot_mapping, torch.int64),
            max_query_len=common.max_query_len,
            max_seq_len=common.max_seq_len,
            query_start_loc_cpu=common.query_start_loc.tolist(),
            seq_lens_cpu=common.seq_lens.tolist(),
        )


class FlashAttentionMetadataBuilder(AttentionMetadataBuilder):
    def build(self, common: CommonAttentionMetadata) -> AttentionMetadata:
        metadata = super().build(common)
        seq_start_loc = np.zeros(common.num_reqs + 1, dtype=np.int32)
        np.cumsum(common.seq_lens, out=seq_start_loc[1:])
        metadata.seq_start_loc = self._to_device(seq_start_loc, torch.int32)
        return metadata


_BUILDERS: dict[str, type[AttentionMetadataBuilder]] = {
    "torch": AttentionMetadataBuilder,
    "flash_attn": FlashAttentionMetadataBuilder,
}


def get_metadata_builder(backend_name: str, device: torch.device) -> AttentionMetadataBuilder:
    """The builder for a backend; backends without special needs (torch, triton) get the base one."""
    return _BUILDERS.get(backend_name, AttentionMetadataBuilder)(device)
