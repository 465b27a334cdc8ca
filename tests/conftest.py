"""Settings every test shares, applied before any test module is imported.

- One torch thread: the suite runs on small shared CPU machines (CI has two cores), where more
  threads are several times slower. Pinned at start-up and again before each test, because some
  libraries reset it.
- Triton kernels run through the CPU interpreter where no GPU is: triton reads TRITON_INTERPRET when
  a kernel is defined, so it must be set before any test module imports ``kernels/triton_*``.
The core's tests need neither torch nor triton; without torch installed these are no-ops.
"""

import os

import pytest

try:
    import torch
except ImportError:  # a core-only install
    torch = None

if torch is not None:
    torch.set_num_threads(1)
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _single_torch_thread():
    if torch is not None:
        torch.set_num_threads(1)
    yield
