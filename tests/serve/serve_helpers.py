"""Helpers shared by the serve tests: reading /metrics, waiting for the server to be idle, running the CLI."""

import time
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {'name{labels}': value} (labels as written), for assertions."""
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def metric(samples: dict[str, float], name: str, **labels: str) -> float:
    """The sample of ``name`` whose labels include ``labels``."""
    for key, value in samples.items():
        base, _, rest = key.partition("{")
        if base == name and all(f'{k}="{v}"' in rest for k, v in labels.items()):
            return value
    raise KeyError(f"no sample {name} {labels}")


def wait_until_idle(url: str, timeout: float = 30.0) -> dict[str, float]:
    """Poll /metrics until no request runs or waits; return the last samples."""
    deadline = time.monotonic() + timeout
    while True:
        samples = parse_metrics(httpx.get(f"{url}/metrics", timeout=5.0).text)
        if (metric(samples, "servesim_num_requests_running") == 0
                and metric(samples, "servesim_num_requests_waiting") == 0):
            return samples
        if time.monotonic() > deadline:
            raise TimeoutError(f"the server still has requests after {timeout} s: {samples}")
        time.sleep(0.05)


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    """``python -m engine.serve ARGV`` in process: (exit status, stderr)."""
    from engine.serve.cli import main

    try:
        status = main(argv)
    except SystemExit as exit_:
        status = exit_.code
    return status, capsys.readouterr().err
