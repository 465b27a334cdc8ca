"""The app in a background thread of the test process (``ServerThread``), the CLI's help, and how the
server answers once its engine has stopped; plus the collector that merges deltas for slow readers."""

import asyncio
import subprocess
import sys

import httpx
import openai

from engine.async_llm import AsyncLLM
from engine.output_collector import RequestOutputCollector
from engine.outputs import CompletionOutput, RequestOutput
from engine.serve import ServerThread, build_app
from tests.serve.serve_helpers import REPO_ROOT


def test_server_thread_serves_then_reports_a_stopped_engine(tiny_model_path):
    engine = AsyncLLM(model=str(tiny_model_path), max_num_seqs=8, num_gpu_blocks=128, max_model_len=256)
    with ServerThread(build_app(engine, "tiny-in-process", shutdown_engine=True)) as server:
        assert server.port != 0
        with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=10) as client:
            response = client.completions.create(model="tiny-in-process", prompt="in process", max_tokens=3,
                                                 extra_body={"ignore_eos": True})
            assert response.usage.completion_tokens == 3
        engine.shutdown()
        health = httpx.get(f"{server.url}/health", timeout=5)
        assert health.status_code == 503 and health.json()["error"]["code"] == "engine_unavailable"
        for stream in (False, True):
            answer = httpx.post(f"{server.url}/v1/completions", timeout=5,
                                json={"prompt": "after shutdown", "max_tokens": 2, "stream": stream})
            # Not streaming: a 503. Streaming: the status was sent before the failure, so an error event.
            if stream:
                assert answer.status_code == 200 and '"error"' in answer.text and answer.text.endswith(
                    "data: [DONE]\n\n")
            else:
                assert answer.status_code == 503 and answer.json()["error"]["type"] == "service_unavailable_error"


def test_a_priority_server_takes_each_requests_priority(tiny_model_path, monkeypatch):
    """With --scheduling-policy priority, a request's ``priority`` (vLLM's extension) reaches the engine."""
    engine = AsyncLLM(model=str(tiny_model_path), max_num_seqs=2, num_gpu_blocks=64, max_model_len=128,
                      scheduling_policy="priority")
    generate, seen = engine.generate, []

    def recording_generate(*args, **kwargs):
        seen.append(kwargs.get("priority"))
        return generate(*args, **kwargs)

    monkeypatch.setattr(engine, "generate", recording_generate)
    with ServerThread(build_app(engine, "tiny", shutdown_engine=True)) as server:
        for endpoint, body in (("completions", {"prompt": "p"}),
                               ("chat/completions", {"messages": [{"role": "user", "content": "p"}]})):
            answer = httpx.post(f"{server.url}/v1/{endpoint}", timeout=10,
                                json={**body, "max_tokens": 2, "ignore_eos": True, "priority": 3})
            assert answer.status_code == 200, answer.text
    assert seen == [3, 3]


def test_cli_help():
    result = subprocess.run([sys.executable, "-m", "engine.serve", "--help"], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0
    for flag in ("--model", "--port", "--max-num-seqs", "--num-gpu-blocks", "--no-enable-prefix-caching",
                 "--served-model-name", "--device", "--dtype"):
        assert flag in result.stdout


def _output(text, token_ids, finished=False):
    completion = CompletionOutput(0, text, token_ids, None, None, "length" if finished else None)
    return RequestOutput("r", None, [1], None, [completion], finished)


def test_collector_merges_deltas_a_slow_reader_has_not_taken():
    async def run():
        collector = RequestOutputCollector(asyncio.get_running_loop(), "delta")
        collector.put(_output("a", [1]))
        collector.put(_output("b", [2]))
        collector.put(_output("c", [3], finished=True))
        merged = await collector.get()
        assert (merged.outputs[0].text, merged.outputs[0].token_ids, merged.finished) == ("abc", [1, 2, 3], True)
        cumulative = RequestOutputCollector(asyncio.get_running_loop(), "cumulative")
        cumulative.put(_output("a", [1]))
        cumulative.put(_output("ab", [1, 2]))
        assert (await cumulative.get()).outputs[0].text == "ab"
        collector.put_error(ValueError("boom"))
        try:
            await collector.get()
        except ValueError as error:
            assert str(error) == "boom"
        else:
            raise AssertionError("the error was not raised")

    asyncio.run(run())
