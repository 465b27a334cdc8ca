"""LoRA adapters through ``python -m engine.serve --enable-lora --lora-modules ...`` and the official openai
client: a request whose model is an adapter's name gets exactly the tokens engine.LLM gives with that adapter
(greedy), /v1/models lists the adapters, an unknown model is vLLM's 404, and bad flags or adapters stop the
server before it listens."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from engine import LLM, SamplingParams
from engine.core import LoRARequest
from tests.engine.lora_fixtures import make_adapters
from tests.serve.conftest import start_server
from tests.serve.serve_helpers import run_cli

PROMPT = "The scheduler picks the next batch"
MESSAGES = [{"role": "user", "content": "Name a cache."}]
MAX_TOKENS = 8
ENGINE_ARGS = dict(max_model_len=512, num_gpu_blocks=256, max_num_seqs=16)


@pytest.fixture(scope="module")
def adapters(tiny_model_path, tmp_path_factory):
    return make_adapters(tmp_path_factory.mktemp("adapters"), tiny_model_path)


@pytest.fixture(scope="module")
def lora_server(tiny_model_path, adapters, tmp_path_factory):
    beta = json.dumps({"name": "beta", "path": str(adapters["beta"]), "base_model_name": "tiny-base"})
    args = ["--max-num-seqs", "16", "--num-gpu-blocks", "256", "--max-model-len", "512", "--enable-lora",
            "--max-loras", "2", "--max-lora-rank", "8", "--lora-modules", f"alpha={adapters['alpha']}", beta]
    process = start_server(tiny_model_path, tmp_path_factory.mktemp("lora-server"), args)
    yield process
    process.stop()


@pytest.fixture(scope="module")
def client(lora_server):
    with openai.OpenAI(base_url=f"{lora_server.url}/v1", api_key="x", max_retries=0, timeout=30.0) as client:
        yield client


@pytest.fixture(scope="module")
def engine_outputs(tiny_model_path, adapters):
    """engine.LLM's greedy tokens for the prompt and the chat, per model name (the server's ids: 1, 2)."""
    llm = LLM(model=str(tiny_model_path), enable_lora=True, max_loras=2, max_lora_rank=8, **ENGINE_ARGS)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    requests = {"tiny": None, "alpha": LoRARequest("alpha", 1, str(adapters["alpha"])),
                "beta": LoRARequest("beta", 2, str(adapters["beta"]))}
    return {name: (llm.generate([PROMPT], params, use_tqdm=False, lora_request=request)[0].outputs[0],
                   llm.chat(MESSAGES, params, use_tqdm=False, lora_request=request)[0].outputs[0])
            for name, request in requests.items()}


def test_models_lists_the_adapters(client, lora_server, adapters):
    assert [model.id for model in client.models.list().data] == ["tiny", "alpha", "beta"]
    cards = {card["id"]: card for card in httpx.get(f"{lora_server.url}/v1/models").json()["data"]}
    assert cards["alpha"]["root"] == str(adapters["alpha"]) and cards["alpha"]["parent"] == "tiny"
    assert cards["beta"]["root"] == str(adapters["beta"]) and cards["beta"]["parent"] == "tiny-base"
    assert cards["tiny"]["parent"] is None


@pytest.mark.parametrize("model", ["tiny", "alpha", "beta"])
def test_completion_with_an_adapter_equals_the_engine(client, engine_outputs, model):
    completion = client.completions.create(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0.0,
                                           extra_body={"ignore_eos": True, "return_token_ids": True})
    choice = completion.choices[0]
    expected = engine_outputs[model][0]
    assert completion.model == model
    assert choice.model_extra["token_ids"] == expected.token_ids and choice.text == expected.text


@pytest.mark.parametrize("model", ["alpha", "beta"])
def test_chat_with_an_adapter_equals_the_engine(client, engine_outputs, model):
    chat = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0.0,
                                          extra_body={"ignore_eos": True, "return_token_ids": True})
    assert chat.choices[0].model_extra["token_ids"] == engine_outputs[model][1].token_ids
    assert chat.choices[0].message.content == engine_outputs[model][1].text


def test_the_adapters_change_the_tokens(engine_outputs):
    assert len({tuple(outputs[0].token_ids) for outputs in engine_outputs.values()}) == 3


def test_streamed_adapter_completion_equals_non_streamed(client, engine_outputs):
    stream = client.completions.create(model="beta", prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0.0,
                                       stream=True, extra_body={"ignore_eos": True})
    assert "".join(chunk.choices[0].text for chunk in stream if chunk.choices) == engine_outputs["beta"][0].text


def test_metrics_name_the_adapters_in_use(client, lora_server):
    """vLLM's lora_requests_info gauge: max_loras and the adapters of running and waiting requests (none once
    every request has finished)."""
    client.completions.create(model="alpha", prompt=PROMPT, max_tokens=2)
    text = httpx.get(f"{lora_server.url}/metrics").text
    lines = [line for line in text.splitlines() if line.startswith("servesim_lora_requests_info{")]
    assert len(lines) == 1
    assert 'max_lora="2"' in lines[0] and 'running_lora_adapters=""' in lines[0]
    assert 'waiting_lora_adapters=""' in lines[0] and float(lines[0].split()[-1]) > 0


def test_an_unknown_model_is_a_404(client):
    with pytest.raises(openai.NotFoundError) as raised:
        client.completions.create(model="gamma", prompt=PROMPT, max_tokens=2)
    assert raised.value.body["message"] == ("The model `gamma` does not exist. This server serves 'tiny', "
                                            "'alpha', 'beta'.")
    assert raised.value.body["param"] == "model"


# ---- flags, checked in-process (no server starts)

@pytest.mark.parametrize("argv,message", [
    (["--lora-modules", "a=/x"], "error: --lora-modules needs --enable-lora"),
    (["--enable-lora", "--lora-modules", "a"], "error: --lora-modules: 'a' must be name=path or a JSON object"),
    (["--enable-lora", "--lora-modules", '{"name": "a"}'], "needs a non-empty string 'name' and 'path'"),
    (["--enable-lora", "--lora-modules", '{"name": "a", "path": "/x", "rank": 2}'], "unknown key(s) ['rank']"),
    (["--enable-lora", "--max-loras", "0"], "error: --max-loras must be >= 1, got 0"),
    (["--enable-lora", "--max-lora-rank", "0"], "error: --max-lora-rank must be >= 1, got 0"),
    (["--enable-lora", "--max-loras", "3", "--max-cpu-loras", "2"],
     "error: --max-cpu-loras must be >= --max-loras (3), got 2"),
])
def test_bad_lora_flags_are_one_line_errors(tiny_model_path, capsys, never_serve, argv, message):
    status, err = run_cli(["--model", str(tiny_model_path), *argv], capsys)
    assert status == 2 and message in err and err.count("\n") == 1, err


def test_a_bad_adapter_stops_the_server_at_start(tiny_model_path, adapters, tmp_path, capsys, never_serve):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "adapter_config.json").write_text((adapters["alpha"] / "adapter_config.json").read_text()
                                             .replace('"bias": "none"', '"bias": "all"'))
    argv = ["--model", str(tiny_model_path), "--max-num-seqs", "4", "--num-gpu-blocks", "32", "--enable-lora",
            "--lora-modules", f"good={adapters['alpha']}", f"bad={bad}"]
    status, err = run_cli(argv, capsys)
    assert status == 2 and err.startswith("error: --lora-modules bad: ") and "field 'bias'" in err, err
    status, err = run_cli([*argv[:-2], f"alpha={adapters['alpha']}", f"alpha={adapters['beta']}"], capsys)
    assert status == 2 and "adapter name 'alpha' is used twice" in err, err


def test_lora_requests_info_names_running_and_waiting_adapters(tiny_model_path, adapters):
    from engine.engine_stats import EngineStats
    from engine.request_inputs import Prompt
    from engine.serve.prometheus import render_metrics

    llm = LLM(model=str(tiny_model_path), enable_lora=True, max_loras=1, max_lora_rank=8, **ENGINE_ARGS)
    params = SamplingParams(temperature=0.0, max_tokens=4)
    for index, name in enumerate(("alpha", "beta")):  # max_loras=1: beta waits while alpha runs
        lora_request = LoRARequest(name, index + 1, str(adapters[name]))
        llm._validate(index, Prompt(None, [5, 6, 7]), params, lora_request)
        llm._add_request(f"r{index}", Prompt(None, [5, 6, 7]), params, lora_request=lora_request)
    llm.engine_core.step()
    stats = EngineStats(llm.scheduler).snapshot()
    assert (stats.max_lora, stats.running_lora_adapters, stats.waiting_lora_adapters) == (1, ["alpha"], ["beta"])
    line = next(line for line in render_metrics(stats, "tiny").splitlines()
                if line.startswith("servesim_lora_requests_info{"))
    assert 'max_lora="1",running_lora_adapters="alpha",waiting_lora_adapters="beta"' in line
    llm._abort(["r0", "r1"])
