"""Paged attention: metadata describing a step's flat batch, and backends that consume it."""

from engine.runner.attention.backend import AttentionBackend, KVCache
from engine.runner.attention.builder import build_attention_metadata, compute_positions
from engine.runner.attention.kv_cache import allocate_kv_caches, kv_cache_bytes_per_block
from engine.runner.attention.metadata import AttentionMetadata, DecodePrefillSplit
from engine.runner.attention.registry import available_attention_backends, get_attention_backend

__all__ = [
    "AttentionBackend",
    "AttentionMetadata",
    "DecodePrefillSplit",
    "KVCache",
    "allocate_kv_caches",
    "available_attention_backends",
    "build_attention_metadata",
    "compute_positions",
    "get_attention_backend",
    "kv_cache_bytes_per_block",
]
