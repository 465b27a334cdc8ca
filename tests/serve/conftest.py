"""The tiny model generated into pytest's temp dir, and one server for the session.

The server runs as ``python -m engine.serve`` in a subprocess (the CLI is part of what is tested, and a
second process lets the client and the server use both cores). It listens on a free loopback port and
is stopped at the end of the session.
"""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

import engine.serve.cli

from engine.models import default_model_path
from tests.serve.serve_helpers import REPO_ROOT


SERVER_START_TIMEOUT_S = 90.0
# Enough sequences and blocks for the load test's 200 concurrent requests to run at once.
SERVER_ARGS = ["--max-num-seqs", "256", "--num-gpu-blocks", "1024", "--max-model-len", "512"]


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory) -> Path:
    return default_model_path("tiny", cache_dir=tmp_path_factory.mktemp("servesim-cache"))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    def __init__(self, model_path: Path, log_path: Path, extra_args: list[str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
        command = [sys.executable, "-m", "engine.serve", "--model", str(model_path), "--served-model-name", "tiny",
                   "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning", *extra_args]
        self._log = open(log_path, "wb")
        self.process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"the server did not become healthy within {timeout} s:\n{self.log()}")

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        self._log.close()


def start_server(model_path: Path, log_dir: Path, extra_args: list[str]) -> ServerProcess:
    """A healthy server on a free port (tried again, up to three times, when another process took the port
    between choosing it and binding it)."""
    for attempt in range(3):
        process = ServerProcess(model_path, log_dir / f"server-{attempt}.log", extra_args)
        try:
            process.wait_ready(SERVER_START_TIMEOUT_S)
            return process
        except (RuntimeError, TimeoutError):
            process.stop()
            if attempt == 2 or "address already in use" not in process.log().lower():
                raise
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def server(tiny_model_path, tmp_path_factory):
    process = start_server(tiny_model_path, tmp_path_factory.mktemp("server-log"), SERVER_ARGS)
    yield process
    process.stop()


@pytest.fixture
def never_serve(monkeypatch):
    """For tests of the CLI's flags: a flag that slipped through would start a server that never returns;
    fail instead."""
    def serve(*args, **kwargs):
        raise AssertionError("the flags were accepted and the server would have started")
    monkeypatch.setattr(engine.serve.cli.uvicorn, "run", serve)
