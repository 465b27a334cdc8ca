"""workload.temperature: the sampling temperature real and server runs ask for (the simulator never samples).
A real run's greedy decoding through it is covered by tests/sim/test_spec_decode_real_run.py, whose kept drafts need it."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from sim.engine_requests import make_request
from workloads import WorkloadError, generate_requests, load_workload

WORKLOAD = {"name": "t", "seed": 3, "model": "tiny", "hardware": "cpu",
            "workload": {"num_requests": 3, "arrival": {"type": "poisson", "rate": 100},
                         "prompt_len": {"type": "constant", "value": 8},
                         "output_len": {"type": "constant", "value": 4}}}


def _workload(**stream):
    return load_workload(dict(WORKLOAD, workload=dict(WORKLOAD["workload"], **stream)))


@pytest.mark.parametrize("value", [-0.5, float("inf"), "hot"])
def test_a_bad_temperature_is_named(value):
    with pytest.raises(WorkloadError, match="workload.temperature"):
        _workload(temperature=value)


def test_requests_sample_at_the_workloads_temperature_or_the_engines_default():
    spec = generate_requests(_workload(temperature=0), vocab_size=1000)[0]
    greedy = make_request(spec, {}, temperature=0.0)
    assert greedy.sampling_params.temperature == 0.0 and greedy.sampling_params.ignore_eos
    assert make_request(spec, {}).sampling_params.temperature == 1.0


@pytest.mark.parametrize("temperature", [None, 0.0, 0.7])
def test_a_server_run_sends_the_temperature_with_every_request(monkeypatch, temperature):
    from sim.server_run import _send_all

    bodies = []

    def respond(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        chunk = {"choices": [{"text": "a", "finish_reason": "length", "token_ids": [5]}]}
        return httpx.Response(200, text=f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n",
                              headers={"content-type": "text/event-stream"})

    specs = generate_requests(_workload(temperature=temperature), vocab_size=1000)
    transport = httpx.MockTransport(respond)
    original = httpx.AsyncClient.__init__
    monkeypatch.setattr(httpx.AsyncClient, "__init__",
                        lambda self, *args, **kwargs: original(self, *args, **dict(kwargs, transport=transport)))
    records = asyncio.run(_send_all(specs, "http://mock", "m", False, "mock", temperature=temperature))
    assert len(records) == len(bodies) == 3
    assert all(body.get("temperature") == temperature for body in bodies)
    assert all(("temperature" in body) == (temperature is not None) for body in bodies)
    assert all(body["model"] == "m" and body["ignore_eos"] for body in bodies)
