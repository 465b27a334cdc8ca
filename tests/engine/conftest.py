"""The generated test checkpoints (one torch thread: tests/conftest.py)."""

import pytest

from tests.engine.model_fixtures import make_tiny_llama, make_tiny_qwen2


@pytest.fixture(scope="session")
def tiny_llama_path(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory)


@pytest.fixture(scope="session")
def tiny_qwen2_path(tmp_path_factory):
    return make_tiny_qwen2(tmp_path_factory)
