"""Keep torch single-threaded: the suite runs on small CPU machines beside other work."""

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _single_thread():
    torch.set_num_threads(1)
    yield


@pytest.fixture(scope="session")
def tiny_llama_path(tmp_path_factory):
    from tests.engine.model_fixtures import make_tiny_llama
    return make_tiny_llama(tmp_path_factory)
