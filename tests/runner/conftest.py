"""The tiny checkpoint shared with tests/engine (one torch thread: tests/conftest.py)."""

import pytest


@pytest.fixture(scope="session")
def tiny_llama_path(tmp_path_factory):
    from tests.engine.model_fixtures import make_tiny_llama
    return make_tiny_llama(tmp_path_factory)


@pytest.fixture(scope="session")
def tiny_qwen2_path(tmp_path_factory):
    from tests.engine.model_fixtures import make_tiny_qwen2
    return make_tiny_qwen2(tmp_path_factory)
