"""Chained hashing of full KV blocks, the key of the prefix cache.

The hash of block ``i`` covers the hash of block ``i - 1``, block ``i``'s token ids and its extra keys,
so equal hashes mean equal *prefixes*, not only equal blocks. The cache salt and the LoRA adapter's name are
extra keys of the first block only: the chain carries them into every later block, so requests with
different salts, or different adapters, never share a cached block. A multimodal item's identifier is an extra
key of every block its placeholder tokens overlap (engine/core/multimodal.py): the placeholders are the same
token for every image, so without it two prompts showing different images would share their KV.

SHA-256 over a fixed byte encoding makes hashes identical across processes and machines (Python's
``hash()`` of a string is randomized per process), and makes collisions negligible, so a hit can be
trusted without re-reading the tokens.
"""

from __future__ import annotations

import hashlib
from array import array
from typing import Sequence

from engine.core.lora import LoRARequest, encode_lora
from engine.core.multimodal import MultiModalFeature, encode_block_items, overlapping_identifiers

BlockHash = bytes

# The parent of the first block: a fixed constant so that hashes are reproducible everywhere.
ROOT_PARENT_HASH: BlockHash = hashlib.sha256(b"servesim/root-block-hash/v1").digest()


def hash_block_tokens(parent_hash: BlockHash, token_ids: Sequence[int], extra_keys: bytes = b"") -> BlockHash:
    """Hash one full block given its parent's hash, its token ids and its extra keys."""
    payload = array("q", token_ids).tobytes()
    if extra_keys:
        # A separator byte keeps (tokens, extra) from colliding with a longer token run.
        payload += b"\x00" + extra_keys
    return hashlib.sha256(parent_hash + payload).digest()


def encode_cache_salt(cache_salt: str | None) -> bytes:
    return b"" if not cache_salt else b"salt:" + cache_salt.encode("utf-8")


def first_block_extra_keys(cache_salt: str | None, lora_request: LoRARequest | None) -> bytes:
    """What the first block's hash covers beside its tokens: the salt, then the adapter (each empty if unset)."""
    salt = encode_cache_salt(cache_salt)
    lora = encode_lora(lora_request)
    return salt + b"\x00" + lora if salt and lora else salt or lora


class BlockHasher:
    """Hashes a request's full blocks that are not hashed yet.

    Called when the request is created and again whenever an appended token fills a block (the
    request tracks that boundary itself, so the common decode step pays nothing here). The tokens of
    all new blocks are encoded once and sliced, which halves the cost of hashing a long prompt.
    """

    __slots__ = ("block_size",)

    def __init__(self, block_size: int) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size!r}")
        self.block_size = block_size

    def __call__(self, request) -> list[BlockHash]:
        block_size = self.block_size
        known = request.block_hashes
        num_hashed = len(known)
        num_full_blocks = request.num_tokens // block_size
        if num_full_blocks <= num_hashed:
            return []
        start = num_hashed * block_size
        encoded = request.all_token_ids[start:num_full_blocks * block_size].tobytes()
        block_bytes = block_size * 8
        parent = known[-1] if num_hashed else ROOT_PARENT_HASH
        new_hashes = []
        mm_features = request.mm_features
        for offset, block_index in enumerate(range(num_hashed, num_full_blocks)):
            payload = encoded[offset * block_bytes:(offset + 1) * block_bytes]
            extra = b""
            if block_index == 0 and (request.cache_salt or request.lora_request is not None):
                extra = first_block_extra_keys(request.cache_salt, request.lora_request)
            if mm_features:
                items = encode_block_items(overlapping_identifiers(
                    mm_features, block_index * block_size, (block_index + 1) * block_size))
                extra = extra + b"\x00" + items if extra and items else extra or items
            if extra:
                payload += b"\x00" + extra
            parent = hashlib.sha256(parent + payload).digest()
            new_hashes.append(parent)
        return new_hashes


def make_block_hasher(block_size: int) -> BlockHasher:
    return BlockHasher(block_size)


def hash_request_blocks(token_ids: Sequence[int], block_size: int, cache_salt: str | None = None,
                        lora_request: LoRARequest | None = None,
                        mm_features: Sequence[MultiModalFeature] = ()) -> list[BlockHash]:
    """The chain of hashes of every full block of ``token_ids`` (for tests and tools)."""
    hashes: list[BlockHash] = []
    parent = ROOT_PARENT_HASH
    for block_index in range(len(token_ids) // block_size):
        start = block_index * block_size
        extra = first_block_extra_keys(cache_salt, lora_request) if block_index == 0 else b""
        items = encode_block_items(overlapping_identifiers(mm_features, start, start + block_size))
        extra = extra + b"\x00" + items if extra and items else extra or items
        parent = hash_block_tokens(parent, token_ids[start:start + block_size], extra)
        hashes.append(parent)
    return hashes
