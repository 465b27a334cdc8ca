"""An OpenAI-compatible HTTP server over ``AsyncLLM`` (FastAPI + uvicorn): ``python -m engine.serve``.

``build_app(engine)`` gives the FastAPI app; ``ServerThread`` runs one in a background thread (tests,
benchmarks, notebooks). Needs the ``serve`` extra (fastapi, uvicorn).

Both are imported on first use, not with the package: ``python -m engine.serve`` imports this package
before its ``__main__``, which names the missing extra when fastapi is not installed; an import here
would fail first, with a bare ModuleNotFoundError.
"""

from __future__ import annotations

import importlib

_EXPORTS = {"build_app": "engine.serve.app", "ServerThread": "engine.serve.server_thread"}
__all__ = ["ServerThread", "build_app"]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'engine.serve' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
