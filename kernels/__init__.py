"""Kernels for the paged KV cache: torch references (the source of truth) and, later, fast versions."""

from kernels.reshape_and_cache import PADDING_SLOT_ID, reshape_and_cache

__all__ = ["PADDING_SLOT_ID", "reshape_and_cache"]
