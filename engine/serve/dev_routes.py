"""Routes vLLM serves only in its development mode (``VLLM_SERVER_DEV_MODE=1``); here under
``SERVESIM_SERVER_DEV_MODE`` (``1`` or ``true``), or ``build_app(dev_mode=True)``. Otherwise they do not exist (404,
like any unknown route): anyone who can reach the server could slow every later request down.

    POST /reset_prefix_cache   forget every prefix the KV cache holds, so that a benchmark's next run starts cold:
                               200 when done; 409 while requests hold blocks (nothing is forgotten then: call it
                               between runs). The host tier of KV offloading keeps its blocks, as vLLM's does.
"""

from __future__ import annotations

import os

from fastapi import FastAPI
from fastapi.responses import Response

from engine.serve.errors import OpenAIError
from engine.serve.state import ServerState

DEV_MODE_ENV_VAR = "SERVESIM_SERVER_DEV_MODE"


def dev_mode_enabled(explicit: bool | None) -> bool:
    if explicit is not None:
        return explicit
    return os.environ.get(DEV_MODE_ENV_VAR, "").strip().lower() in ("1", "true")


def add_dev_routes(app: FastAPI, state: ServerState) -> None:
    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> Response:
        if not await state.engine.reset_prefix_cache():
            raise OpenAIError("requests hold KV blocks, so the prefix cache was not reset; reset it when no "
                              "request runs", status=409, code="prefix_cache_in_use")
        return Response(status_code=200)
