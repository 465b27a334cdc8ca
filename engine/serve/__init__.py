"""An OpenAI-compatible HTTP server over ``AsyncLLM`` (FastAPI + uvicorn): ``python -m engine.serve``.

``build_app(engine)`` gives the FastAPI app; ``ServerThread`` runs one in a background thread (tests,
benchmarks, notebooks). Needs the ``serve`` extra (fastapi, uvicorn).
"""

from engine.serve.app import build_app
from engine.serve.server_thread import ServerThread

__all__ = ["ServerThread", "build_app"]
