"""Llama 4's chunked layers on the 'triton' backend: the per-chunk virtual requests are ordinary requests to the
kernel, and the logits equal the torch backend's (on CPU through Triton's interpreter, this directory's conftest)."""

import importlib.util

import pytest
import torch

from engine.models import load_model
from tests.models.test_llama4_model import BLOCK, CHUNK, _prompt, write_llama4
from tests.models.test_models_vs_transformers import PagedSession

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


def test_chunked_prefill_and_decodes_equal_the_torch_backend(tmp_path):
    path = write_llama4(tmp_path / "llama4")
    tokens = {"a": _prompt(1, 37), "b": _prompt(2, 9)}
    logits = {}
    for backend in ("torch", "triton"):
        model, config = load_model(path, torch.float32, attention_backend=backend)
        session = PagedSession(model, config, block_size=BLOCK, seed=4, attention_chunk=CHUNK)
        first = session.step({"a": tokens["a"][:20], "b": tokens["b"]})
        second = session.step({"a": tokens["a"][20:]})
        third = session.step({"a": [5], "b": [6]})
        logits[backend] = torch.cat([first["a"], first["b"], second["a"], third["a"], third["b"]])
    torch.testing.assert_close(logits["triton"], logits["torch"], atol=1e-4, rtol=0)
