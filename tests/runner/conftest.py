"""Keep torch single-threaded: the suite runs on small CPU machines beside other work."""

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _single_thread():
    torch.set_num_threads(1)
    yield
