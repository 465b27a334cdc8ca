"""``sim.run --executor server`` with a LoRA workload: each request names its adapter as its model, and a server
started with the flags ``python -m sim.real_lora_adapters`` prints serves them; the run records each request's
adapter. The server runs in this process (``engine.serve.ServerThread``)."""

from __future__ import annotations

import pytest

from analysis import read_run
from sim.real_lora_adapters import main as adapters_main

pytest.importorskip("fastapi")

WORKLOAD = {
    "name": "lora-served", "seed": 4, "model": "tiny",
    "engine": {"max_model_len": 256, "max_loras": 1, "max_lora_rank": 8},
    "workload": {"num_requests": 10, "arrival": {"type": "poisson", "rate": 50},
                 "prompt_len": {"type": "uniform", "min": 8, "max": 40},
                 "output_len": {"type": "uniform", "min": 2, "max": 8},
                 "lora": {"adapters": 3, "rank": 8, "base_model_fraction": 0.2,
                          "target_modules": ["q_proj", "v_proj"]}},
}


def test_a_lora_workload_runs_against_a_server_of_its_adapters(tmp_path, monkeypatch, capsys):
    import yaml

    from engine.async_llm import AsyncLLM
    from engine.core import LoRARequest
    from engine.serve import ServerThread, build_app
    from sim.run import main as run_main

    monkeypatch.setenv("SERVESIM_CACHE", str(tmp_path / "cache"))
    workload_file = tmp_path / "lora.yaml"
    workload_file.write_text(yaml.safe_dump(WORKLOAD))
    assert adapters_main([str(workload_file), "--model", "tiny"]) == 0
    flags = capsys.readouterr().out.split()
    assert flags[:8] == ["--enable-lora", "--max-loras", "1", "--max-lora-rank", "8", "--max-cpu-loras", "1",
                         "--lora-modules"]
    modules = dict(flag.split("=", 1) for flag in flags[8:])
    assert sorted(modules) == ["adapter-0", "adapter-1", "adapter-2"]
    assert all((tmp_path / "cache").as_posix() in path for path in modules.values())

    engine = AsyncLLM(model="tiny", max_num_seqs=8, num_gpu_blocks=128, max_model_len=256, enable_lora=True,
                      max_loras=1, max_lora_rank=8, max_cpu_loras=1)
    asked = []
    generate = engine.generate
    monkeypatch.setattr(engine, "generate", lambda prompt, params, *args, lora_request=None, **kwargs: (
        asked.append(None if lora_request is None else lora_request.lora_name),
        generate(prompt, params, *args, lora_request=lora_request, **kwargs))[1])
    lora_requests = {name: LoRARequest(name, index + 1, path) for index, (name, path) in enumerate(sorted(modules.items()))}
    with ServerThread(build_app(engine, "tiny", shutdown_engine=True, lora_requests=lora_requests)) as server:
        assert run_main([str(workload_file), "--executor", "server", "--url", server.url, "--out",
                         str(tmp_path / "served"), "--no-dashboard", "--no-progress"]) == 0
    engine.shutdown()
    requests = read_run(tmp_path / "served").requests
    assert (requests["finish_reason"] == "length").all() and len(requests) == 10
    # The server ran each request with the adapter the workload drew for it.
    recorded = [name if isinstance(name, str) else None for name in requests["lora_name"]]
    assert sorted(asked, key=str) == sorted(recorded, key=str)
    assert {name for name in asked if name} <= set(modules) and any(asked) and None in asked


def test_the_adapter_flags_need_a_lora_workload(capsys):
    assert adapters_main(["chat", "--model", "tiny"]) == 2
    assert "names no LoRA adapter" in capsys.readouterr().err
