"""The generated "small" model (8,192-token BPE vocabulary, random weights) for the structured-output tests,
built once per session into pytest's temporary directory (about two seconds), and the "tiny" one for tests
that need an engine of their own."""

import pytest

from engine.models import default_model_path

pytest.importorskip("xgrammar")  # the structured extra; tests/engine/test_missing_extras.py covers its absence


@pytest.fixture(scope="session")
def small_model_path(tmp_path_factory):
    return default_model_path("small", cache_dir=tmp_path_factory.mktemp("servesim-small"))


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    return default_model_path("tiny", cache_dir=tmp_path_factory.mktemp("servesim-tiny"))
