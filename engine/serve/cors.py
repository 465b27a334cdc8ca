"""Cross-origin requests: a web page served from elsewhere (a playground, a notebook front end) may call the server
from a browser. As vLLM, the server answers CORS with ``--allowed-origins``, ``--allowed-methods`` and
``--allowed-headers`` (each defaults to ``*``: any) and ``--allow-credentials`` (off), through starlette's middleware,
which also answers the browser's preflight ``OPTIONS`` requests (before the API-key check: a preflight carries no key).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware


@dataclass(frozen=True)
class CorsSettings:
    allowed_origins: list[str] = field(default_factory=lambda: ["*"])
    allowed_methods: list[str] = field(default_factory=lambda: ["*"])
    allowed_headers: list[str] = field(default_factory=lambda: ["*"])
    allow_credentials: bool = False


def add_cors(app: FastAPI, settings: CorsSettings) -> None:
    app.add_middleware(CORSMiddleware, allow_origins=settings.allowed_origins,
                       allow_methods=settings.allowed_methods, allow_headers=settings.allowed_headers,
                       allow_credentials=settings.allow_credentials)
