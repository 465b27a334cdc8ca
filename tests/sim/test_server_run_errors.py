"""``sim.run --executor server``: a request the server refuses keeps the server's message, in
requests.parquet's status_message and in the summary's errored_examples, as a simulation keeps an
ignored request's reason. The server runs in this process (``engine.serve.ServerThread``)."""

import pytest

from analysis import read_run
from sim.run import main as run_main

pytest.importorskip("fastapi")


@pytest.fixture(scope="module")
def server_url():
    from engine.async_llm import AsyncLLM
    from engine.serve import ServerThread, build_app

    engine = AsyncLLM(model="tiny", max_num_seqs=8, num_gpu_blocks=128, max_model_len=256)
    with ServerThread(build_app(engine, "tiny", shutdown_engine=True)) as server:
        yield server.url
    engine.shutdown()


def test_a_request_the_server_refuses_keeps_its_message(server_url, tmp_path, capsys):
    out = tmp_path / "served"
    assert run_main(["chat", "--executor", "server", "--url", server_url, "--set", "workload.num_requests=3",
                     "--set", "workload.prompt_len={type: constant, value: 500}", "--set", "workload.arrival.rate=100",
                     "--out", str(out), "--no-dashboard", "--no-progress"]) == 1  # nothing was served
    run = read_run(out)
    assert run.summary["num_errored"] == 3
    messages = run.requests["status_message"].tolist()
    assert all(message.startswith("HTTP 400: prompt has 500 tokens") for message in messages), messages
    assert run.summary["errored_examples"][0]["reason"] == messages[0]
    captured = capsys.readouterr()
    printed = " ".join(captured.out.split())
    assert "errored requests, the first: req-000000: HTTP 400: prompt has 500 tokens" in printed
    assert "error: every request failed; the first: HTTP 400: prompt has 500 tokens" in captured.err


def test_a_priority_workload_sends_its_priorities_and_an_fcfs_server_says_no(server_url, tmp_path):
    """The workload asks for priority scheduling; the fcfs server refuses the priorities, by name, rather
    than serving the run as if they had been honoured."""
    out = tmp_path / "priority"
    assert run_main(["priority", "--executor", "server", "--url", server_url, "--set", "workload.num_requests=4",
                     "--set", "workload.prompt_len={type: constant, value: 16}", "--set",
                     "workload.output_len={type: constant, value: 2}", "--set", "engine.max_model_len=256",
                     "--set", "workload.priority={levels: [1], weights: [1]}",
                     "--out", str(out), "--no-dashboard", "--no-progress"]) == 1
    messages = read_run(out).requests["status_message"].tolist()
    assert all("priority 1 needs scheduling_policy='priority'" in message for message in messages), messages
