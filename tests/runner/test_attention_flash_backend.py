"""The flash_attn backend: a clear error without CUDA; on CUDA it matches the torch reference."""

import math

import pytest
import torch

from engine.runner.attention import allocate_kv_caches, build_attention_metadata, get_attention_backend

try:
    import flash_attn  # noqa: F401
    HAVE_FLASH_ATTN = True
except ImportError:
    HAVE_FLASH_ATTN = False


@pytest.mark.skipif(torch.cuda.is_available() and HAVE_FLASH_ATTN, reason="flash_attn is usable here")
def test_clear_error_when_unusable():
    with pytest.raises(RuntimeError, match="flash_attn"):
        get_attention_backend("flash_attn")


@pytest.mark.skipif(not (torch.cuda.is_available() and HAVE_FLASH_ATTN), reason="needs CUDA and flash-attn")
@pytest.mark.parametrize("block_size", [16, 256])
def test_matches_torch_backend_on_cuda(block_size):
    torch.manual_seed(0)
    shapes = [(37, 1), (0, 23), (50, 1), (33, 9), (300, 4)]
    num_blocks = sum(-(-(c + q) // block_size) for c, q in shapes) + 3
    num_heads, num_kv_heads, head_size = 8, 2, 64
    perm = torch.randperm(num_blocks).tolist()
    block_ids = []
    for c, q in shapes:
        block_ids.append([perm.pop() for _ in range(-(-(c + q) // block_size))])
    metadata = build_attention_metadata([c for c, _ in shapes], [q for _, q in shapes], block_ids, block_size,
                                        device="cuda")
    caches = allocate_kv_caches(1, num_blocks, block_size, num_kv_heads, head_size, torch.bfloat16, "cuda")
    key_cache, value_cache = caches[0]
    key_cache.normal_()
    value_cache.normal_()
    n = metadata.num_actual_tokens
    q = torch.randn(n, num_heads, head_size, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(n, num_kv_heads, head_size, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(n, num_kv_heads, head_size, device="cuda", dtype=torch.bfloat16)
    scale = 1 / math.sqrt(head_size)
    reference = get_attention_backend("torch").forward(q, k, v, (key_cache.clone(), value_cache.clone()),
                                                       metadata, scale)
    output = get_attention_backend("flash_attn").forward(q, k, v, (key_cache, value_cache), metadata, scale)
    torch.testing.assert_close(output.float(), reference.float(), atol=2e-2, rtol=2e-2)
