"""Kernels for the paged KV cache: a torch reference for each (the source of truth) and fast versions.

    reshape_and_cache.py           cache write, torch reference (fp8 option: fp8.py)
    triton_reshape_and_cache.py    the same as a Triton kernel
    cuda_reshape_and_cache.py      the same as a CUDA kernel (csrc/), built on first use
    paged_attention.py             paged attention over a mixed batch, torch reference
    triton_paged_attention.py      the same as one unified Triton kernel (+ split-KV combine)
    paged_batch.py                 adversarial random batches for tests and benchmarks

Only the references are imported here: triton and the CUDA toolchain are imported when a fast kernel is
first asked for (``kernels/triton_support.py``), so the package imports on any machine.
"""

from kernels.reshape_and_cache import PADDING_SLOT_ID, reshape_and_cache

__all__ = ["PADDING_SLOT_ID", "reshape_and_cache"]
