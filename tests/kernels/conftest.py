"""Keep torch single-threaded, and run the Triton kernels through the CPU interpreter where no GPU is.

Triton decides at kernel-definition time (when ``kernels/triton_*.py`` is imported) whether to compile
or interpret, so ``TRITON_INTERPRET`` is set here, before any test module can import triton. Only
triton reads the variable, so the other tests sharing this process are unaffected; on a machine with
CUDA it is left alone and the same tests run the compiled kernels on the GPU.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _single_thread():
    torch.set_num_threads(1)
    yield
