"""Single torch thread (the suite shares small CPU machines), and the generated test checkpoints."""

import pytest
import torch

from tests.engine.model_fixtures import make_tiny_llama, make_tiny_qwen2

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _single_thread():
    torch.set_num_threads(1)
    yield


@pytest.fixture(scope="session")
def tiny_llama_path(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory)


@pytest.fixture(scope="session")
def tiny_qwen2_path(tmp_path_factory):
    return make_tiny_qwen2(tmp_path_factory)
