"""The project imports, and its torch paths work, where triton is absent; asking for Triton fails clearly.

Runs in a subprocess: triton is hidden from the import system there (``sys.modules['triton'] = None``
makes ``import triton`` fail and ``find_spec`` report it missing), which must not leak into this process.
"""

import subprocess
import sys
import textwrap
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import sys
    HIDE = sys.argv[1] == "hide"
    if HIDE:
        sys.modules["triton"] = None
    import torch
    import kernels, kernels.paged_attention, kernels.paged_batch, engine.runner.cuda_graph_runner
    import kernels.cuda_reshape_and_cache, kernels.triton_support
    from engine.runner.attention import get_attention_backend, available_attention_backends
    assert "triton" in available_attention_backends()
    # Importing the project never imports triton, installed or not.
    assert sys.modules.get("triton") is None, "triton was imported eagerly"
    if HIDE:
        assert "not installed" in kernels.triton_support.triton_unavailable_reason()
        try:
            get_attention_backend("triton")
        except RuntimeError as error:
            assert "attention backend 'triton' cannot run here" in str(error), error
        else:
            raise AssertionError("the triton backend was created without triton")
        try:
            import kernels.triton_paged_attention
        except ImportError:
            pass
        else:
            raise AssertionError("kernels.triton_paged_attention imported without triton")
    get_attention_backend("torch")
    print("ok")
""")


def _run(mode):
    result = subprocess.run([sys.executable, "-c", SCRIPT, mode], cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stdout + result.stderr


def test_project_imports_and_refuses_triton_clearly_without_it():
    _run("hide")


def test_importing_the_project_does_not_import_triton():
    _run("show")
