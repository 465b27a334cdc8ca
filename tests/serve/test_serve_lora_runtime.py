"""vLLM's runtime LoRA updates: ``POST /v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` on
``python -m engine.serve --enable-lora --allow-runtime-lora-updating``, driven with httpx, the adapters then used
through the official openai client. A loaded adapter gives exactly engine.LLM's greedy tokens and is listed; an
unloaded one is an unknown model; a name loaded again from other weights gives the new weights' tokens and never
the old adapter's cached KV; bad loads register nothing; a request streaming while its adapter is unloaded (and
the name loaded again) finishes with the adapter it started with; and no KV block leaks."""

from __future__ import annotations

import shutil

import httpx
import openai
import pytest

from engine import LLM, SamplingParams
from engine.async_llm import AsyncLLM
from engine.core import LoRARequest
from engine.serve import ServerThread, build_app
from engine.serve.lora_updates import ALLOW_ENV_VAR
from tests.engine.lora_fixtures import make_adapters
from tests.serve.conftest import start_server
from tests.serve.serve_helpers import metric, parse_metrics, run_cli, wait_until_idle

# 70 token ids: four full blocks of 16 that the prefix cache can keep, then a partial one.
PROMPT = [3 + (7 * index) % 200 for index in range(70)]
MAX_TOKENS = 8
STREAM_TOKENS = 300
ENGINE_ARGS = dict(max_model_len=512, num_gpu_blocks=256, max_num_seqs=16)


@pytest.fixture(scope="module")
def adapters(tiny_model_path, tmp_path_factory):
    return make_adapters(tmp_path_factory.mktemp("adapters"), tiny_model_path)


@pytest.fixture(scope="module")
def lora_server(tiny_model_path, adapters, tmp_path_factory):
    args = ["--max-num-seqs", "16", "--num-gpu-blocks", "256", "--max-model-len", "512", "--enable-lora",
            "--max-loras", "2", "--max-lora-rank", "8", "--allow-runtime-lora-updating",
            "--lora-modules", f"static={adapters['alpha']}"]
    process = start_server(tiny_model_path, tmp_path_factory.mktemp("lora-runtime"), args)
    yield process
    process.stop()


@pytest.fixture(scope="module")
def client(lora_server):
    with openai.OpenAI(base_url=f"{lora_server.url}/v1", api_key="x", max_retries=0, timeout=60.0) as client:
        yield client


@pytest.fixture(scope="module")
def expected(tiny_model_path, adapters):
    """engine.LLM's greedy tokens for PROMPT per adapter, and its STREAM_TOKENS-token text with beta."""
    llm = LLM(model=str(tiny_model_path), enable_lora=True, max_loras=2, max_lora_rank=8, **ENGINE_ARGS)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    requests = {name: LoRARequest(name, index + 1, str(adapters[name])) for index, name in enumerate(adapters)}
    tokens = {name: llm.generate([PROMPT], params, use_tqdm=False, lora_request=request)[0].outputs[0].token_ids
              for name, request in {"base": None, **requests}.items()}
    assert len({tuple(ids) for ids in tokens.values()}) == 3  # the adapters change the tokens
    long_params = SamplingParams(temperature=0.0, max_tokens=STREAM_TOKENS, ignore_eos=True)
    tokens["beta_stream_text"] = llm.generate([PROMPT[:20]], long_params, use_tqdm=False,
                                              lora_request=requests["beta"])[0].outputs[0].text
    return tokens


def load(server, name: str, path, **extra) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path), **extra},
                      timeout=30.0)


def unload(server, name: str, **extra) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/unload_lora_adapter", json={"lora_name": name, **extra}, timeout=30.0)


def complete(client, model: str) -> tuple[list[int], int]:
    """Greedy token ids for PROMPT, and how many prompt tokens the prefix cache gave."""
    completion = client.completions.create(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0.0,
                                           extra_body={"ignore_eos": True, "return_token_ids": True})
    return completion.choices[0].model_extra["token_ids"], completion.usage.prompt_tokens_details.cached_tokens


def model_ids(client) -> list[str]:
    return [model.id for model in client.models.list().data]


def test_a_loaded_adapter_runs_and_is_listed_until_unloaded(client, lora_server, adapters, expected):
    answer = load(lora_server, "dyn", adapters["beta"])
    assert answer.status_code == 200 and answer.text == "Success: LoRA adapter 'dyn' added successfully."
    assert model_ids(client) == ["tiny", "static", "dyn"]
    card = next(card for card in httpx.get(f"{lora_server.url}/v1/models").json()["data"] if card["id"] == "dyn")
    assert card["root"] == str(adapters["beta"]) and card["parent"] == "tiny"
    assert complete(client, "dyn")[0] == expected["beta"]
    assert complete(client, "static")[0] == expected["alpha"]  # the --lora-modules adapter is still served

    answer = unload(lora_server, "dyn")
    assert answer.status_code == 200 and answer.text == "Success: LoRA adapter 'dyn' removed successfully."
    assert model_ids(client) == ["tiny", "static"]
    with pytest.raises(openai.NotFoundError) as raised:
        complete(client, "dyn")
    assert raised.value.body["message"] == "The model `dyn` does not exist. This server serves 'tiny', 'static'."


def test_a_name_loaded_again_runs_the_new_weights_never_the_old_kv(client, lora_server, adapters, expected,
                                                                   tmp_path):
    """Three adapters under one name: beta from a folder, alpha from another path, then the first folder
    overwritten with alpha's files. Each load is a new id, so neither the runner's copy of the old weights
    nor the prefix cache's KV of the same prompt under the old adapter is used."""
    folder = tmp_path / "swap"
    shutil.copytree(adapters["beta"], folder)
    assert load(lora_server, "swap", folder).status_code == 200
    assert complete(client, "swap") == (expected["beta"], 0)
    assert complete(client, "swap") == (expected["beta"], 64)  # the prefix cache is on: four blocks hit

    for path in (adapters["alpha"], folder):
        assert unload(lora_server, "swap").status_code == 200
        if path == folder:
            shutil.rmtree(folder)
            shutil.copytree(adapters["alpha"], folder)
        assert load(lora_server, "swap", path).status_code == 200
        assert complete(client, "swap") == (expected["alpha"], 0)
        assert complete(client, "swap") == (expected["alpha"], 64)
    assert unload(lora_server, "swap").status_code == 200


def test_a_bad_adapter_is_a_400_naming_lora_path_and_registers_nothing(client, lora_server, adapters, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(adapters["alpha"], bad)
    config = bad / "adapter_config.json"
    config.write_text(config.read_text().replace('"bias": "none"', '"bias": "all"'))
    for path, reason in ((tmp_path / "nowhere", "does not exist"), (bad, "field 'bias'")):
        answer = load(lora_server, "broken", path)
        error = answer.json()["error"]
        assert answer.status_code == 400 and error["param"] == "lora_path", answer.text
        assert error["message"].startswith(f"lora_path {str(path)!r}: ") and reason in error["message"], error
        assert model_ids(client) == ["tiny", "static"]
        with pytest.raises(openai.NotFoundError):
            complete(client, "broken")
    # Nothing was registered: the name is free for a good adapter.
    assert load(lora_server, "broken", adapters["alpha"]).status_code == 200
    assert unload(lora_server, "broken").status_code == 200


@pytest.mark.parametrize("body,param,message", [
    ({"lora_name": "x"}, "lora_path", "missing required parameter: 'lora_path'"),
    ({"lora_path": "/x"}, "lora_name", "missing required parameter: 'lora_name'"),
    ({"lora_name": "", "lora_path": "/x"}, "lora_name", "lora_name must be a non-empty string"),
    ({"lora_name": "x", "lora_path": 3}, "lora_path", "lora_path: Input should be a valid string"),
    ({"lora_name": "tiny", "lora_path": "/x"}, "lora_name", "lora_name 'tiny' is the base model's name"),
    ({"lora_name": "static", "lora_path": "/x"}, "lora_name", "The LoRA adapter 'static' has already been loaded"),
])
def test_bad_load_requests_are_400s(lora_server, body, param, message):
    answer = httpx.post(f"{lora_server.url}/v1/load_lora_adapter", json=body, timeout=30.0)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == param, answer.text
    assert answer.json()["error"]["message"].startswith(message), answer.text


def test_loading_a_loaded_name_is_a_400(lora_server, adapters):
    assert load(lora_server, "twice", adapters["alpha"]).status_code == 200
    answer = load(lora_server, "twice", adapters["beta"])
    assert answer.status_code == 400 and "'twice' has already been loaded" in answer.json()["error"]["message"]
    assert answer.json()["error"]["code"] == "lora_adapter_already_loaded"
    assert unload(lora_server, "twice").status_code == 200


def test_unloading_an_unknown_adapter_is_a_404(client, lora_server):
    for name, extra, message in (("nope", {}, "The LoRA adapter 'nope' cannot be found."),
                                 ("static", {"lora_int_id": 99},
                                  "The LoRA adapter 'static' with lora_int_id 99 cannot be found.")):
        answer = unload(lora_server, name, **extra)
        error = answer.json()["error"]
        assert answer.status_code == 404 and error["message"] == message and error["param"] == "lora_name"
        assert error["code"] == "lora_adapter_not_found" and error["type"] == "not_found_error"
    assert model_ids(client) == ["tiny", "static"]
    answer = unload(lora_server, "")
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "lora_name"


def test_unloading_while_a_request_streams_lets_it_finish_with_its_adapter(client, lora_server, adapters,
                                                                          expected):
    """The stream started with beta under "live"; mid-stream the name is unloaded (a new request naming it is a
    404) and loaded again as alpha (a new request gets alpha's tokens); the stream still ends with all of
    beta's tokens, and /metrics named "live" as running while it ran."""
    assert load(lora_server, "live", adapters["beta"]).status_code == 200
    stream = client.completions.create(model="live", prompt=PROMPT[:20], max_tokens=STREAM_TOKENS,
                                       temperature=0.0, stream=True, extra_body={"ignore_eos": True})
    chunks = iter(stream)
    text = [next(chunks).choices[0].text]
    assert unload(lora_server, "live").status_code == 200
    running = parse_metrics(httpx.get(f"{lora_server.url}/metrics").text)
    assert metric(running, "servesim_lora_requests_info", running_lora_adapters="live") > 0
    with pytest.raises(openai.NotFoundError):
        complete(client, "live")
    assert load(lora_server, "live", adapters["alpha"]).status_code == 200
    assert complete(client, "live")[0] == expected["alpha"]
    finish_reasons = []
    for chunk in chunks:
        if chunk.choices:
            text.append(chunk.choices[0].text)
            finish_reasons.append(chunk.choices[0].finish_reason)
    assert "".join(text) == expected["beta_stream_text"] and finish_reasons[-1] == "length"
    assert unload(lora_server, "live").status_code == 200


def test_no_block_leaks_after_loads_and_unloads(lora_server):
    samples = wait_until_idle(lora_server.url)
    assert metric(samples, "servesim_kv_cache_free_blocks") == metric(samples, "servesim_kv_cache_usable_blocks")
    info = next(key for key in samples if key.startswith("servesim_lora_requests_info{"))
    assert 'running_lora_adapters=""' in info and 'waiting_lora_adapters=""' in info


# ---- the permission: in-process apps over one engine without LoRA

@pytest.fixture(scope="module")
def plain_engine(tiny_model_path):
    engine = AsyncLLM(model=str(tiny_model_path), max_num_seqs=4, num_gpu_blocks=32, max_model_len=128)
    yield engine
    engine.shutdown()


def test_without_the_permission_the_routes_do_not_exist(plain_engine, monkeypatch):
    monkeypatch.delenv(ALLOW_ENV_VAR, raising=False)
    with ServerThread(build_app(plain_engine, "tiny")) as server:
        for route, body in (("load_lora_adapter", {"lora_name": "a", "lora_path": "/x"}),
                            ("unload_lora_adapter", {"lora_name": "a"})):
            answer = httpx.post(f"{server.url}/v1/{route}", json=body, timeout=10.0)
            assert answer.status_code == 404, answer.text
            assert answer.json()["error"]["message"] == f"no route POST /v1/{route}"


@pytest.mark.parametrize("value", ["true", "1", "True"])
def test_the_environment_variable_gives_the_permission(plain_engine, monkeypatch, value):
    monkeypatch.setenv(ALLOW_ENV_VAR, value)
    with ServerThread(build_app(plain_engine, "tiny")) as server:
        answer = httpx.post(f"{server.url}/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": "/x"},
                            timeout=10.0)
        assert answer.status_code == 400 and "needs a server started with --enable-lora" in answer.text
        assert httpx.post(f"{server.url}/v1/unload_lora_adapter", json={"lora_name": "a"},
                          timeout=10.0).status_code == 404
    # build_app's argument overrides the environment either way.
    with ServerThread(build_app(plain_engine, "tiny", allow_runtime_lora_updating=False)) as server:
        answer = httpx.post(f"{server.url}/v1/unload_lora_adapter", json={"lora_name": "a"}, timeout=10.0)
        assert answer.json()["error"]["message"] == "no route POST /v1/unload_lora_adapter"


def test_the_flag_needs_enable_lora(tiny_model_path, capsys, never_serve):
    status, err = run_cli(["--model", str(tiny_model_path), "--allow-runtime-lora-updating"], capsys)
    assert status == 2 and err == "error: --allow-runtime-lora-updating needs --enable-lora\n"
