"""``--api-key``: the OpenAI routes answer only requests that carry a key (vLLM's ``--api-key`` / ``VLLM_API_KEY``).

A request to a path under ``/v1`` must send ``Authorization: Bearer <key>`` with one of the server's keys (the official
clients send their ``api_key`` so); anything else is a 401 in OpenAI's error shape, which the openai client raises as
``AuthenticationError``. As in vLLM, the other routes stay open (``/health`` and ``/metrics`` for probes and scrapers,
``/tokenize``, ``/version``), and so do CORS preflight (OPTIONS) requests. Keys are compared in constant time.
"""

from __future__ import annotations

import hmac
import os

from fastapi import FastAPI, Request

from engine.serve.errors import OpenAIError

API_KEY_ENV_VAR = "SERVESIM_API_KEY"


def server_api_keys(explicit: list[str] | None) -> list[str]:
    """The keys the server takes: ``explicit`` (``--api-key``), else the environment variable's, else none."""
    if explicit:
        return list(explicit)
    from_env = os.environ.get(API_KEY_ENV_VAR, "")
    return [from_env] if from_env else []


def add_api_key_check(app: FastAPI, keys: list[str]) -> None:
    if not keys or any(not key for key in keys):
        raise ValueError(f"api keys must be non-empty strings, got {keys!r}")
    expected = [f"Bearer {key}".encode() for key in keys]

    @app.middleware("http")
    async def require_api_key(request: Request, call_next):
        if request.method == "OPTIONS" or not request.url.path.startswith("/v1"):
            return await call_next(request)
        sent = request.headers.get("Authorization", "").encode()
        if not any(hmac.compare_digest(sent, key) for key in expected):
            return OpenAIError("a valid API key is required: send Authorization: Bearer <key>", status=401,
                               code="invalid_api_key").to_response()
        return await call_next(request)
