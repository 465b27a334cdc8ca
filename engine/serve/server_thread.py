"""Run the server in a background thread of this process (tests, benchmarks, notebooks).

    with ServerThread(build_app(AsyncLLM(model="tiny"), "tiny", shutdown_engine=True)) as server:
        httpx.get(server.url + "/health")

Port 0 (the default) lets the OS pick a free port; ``url`` has the real one once started. uvicorn
installs no signal handlers outside the main thread, so the host process keeps its own.
"""

from __future__ import annotations

import threading
import time

import uvicorn
from fastapi import FastAPI

DEFAULT_START_TIMEOUT_S = 30.0


class ServerThread:
    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning") -> None:
        self.host = host
        self.port = port
        config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                                lifespan="on", timeout_graceful_shutdown=5)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="uvicorn", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = DEFAULT_START_TIMEOUT_S) -> "ServerThread":
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"the server on {self.host}:{self.port} failed to start (see the log)")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the server did not start within {timeout} s")
            time.sleep(0.02)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
