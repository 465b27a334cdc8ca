"""A real run of a LoRA workload (``--executor real`` with ``workload.lora``) and its replay: adapters generated
for the run's model (sim/real_lora_adapters.py), the runner's slots and loads recorded per step
(sim/real_lora_steps.py), and a replay that takes every scheduling decision the real run took."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from analysis import read_run  # noqa: E402
from sim.real_engine import build_real_engine  # noqa: E402
from sim.real_lora_adapters import write_workload_adapters  # noqa: E402
from sim.real_run import run_real  # noqa: E402
from sim.replay import run_replay  # noqa: E402
from sim.trace_recorder import LORA_STEP_COLUMNS  # noqa: E402
from workloads import load_workload  # noqa: E402

from tests.sim.test_real_runs import WORKLOAD  # noqa: E402

# Three adapters, two device slots and a host cache of two: requests of the third adapter wait for a slot, and
# reading it pushes another out of host memory. Arrivals slower than the other real-run tests' so that adapters
# take turns (how often depends on the machine's speed: the counts below are only checked against the runner's).
LORA = dict(WORKLOAD, engine=dict(WORKLOAD["engine"], max_loras=2, max_cpu_loras=2, max_lora_rank=8),
            workload=dict(WORKLOAD["workload"], arrival={"type": "poisson", "rate": 40},
                          lora={"adapters": 3, "rank": [4, 8], "popularity": "uniform", "base_model_fraction": 0.25}))


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    workload = load_workload(LORA)
    real = build_real_engine(workload, model="tiny", threads=1)
    assert sorted(real.lora_paths) == ["adapter-0", "adapter-1", "adapter-2"]
    out = tmp_path_factory.mktemp("lora_real") / "run"
    result = run_real(workload, out, real.engine, vocab_size=real.vocab_size,
                      reserved_token_ids=real.reserved_token_ids, executor_info=real.info,
                      lora_paths=real.lora_paths, lora_manager=real.lora_manager)
    manager = real.engine.scheduler.kv_cache_manager
    assert result.summary["num_finished"] == 40 and manager.num_free_blocks == manager.num_usable_blocks
    return out, real


def test_the_real_run_serves_every_adapter_one_at_a_time_and_records_its_loads(lora_run):
    out, real = lora_run
    run = read_run(out)
    names = run.requests["lora_name"]
    assert set(names.dropna()) == {"adapter-0", "adapter-1", "adapter-2"} and names.isna().any()
    steps = run.steps
    assert steps["num_active_loras"].max() <= 2  # max_loras
    assert (steps["num_lora_tokens"] <= steps["num_scheduled_tokens"]).all()
    # Every slot fill the runner made is in the trace, each timed, and only steps that loaded took load time.
    lora = real.lora_manager
    assert steps["num_lora_loads"].sum() == lora.slots.num_slot_loads >= 3
    assert steps["num_lora_disk_loads"].sum() == lora.host_cache.num_loads >= 3
    loading = steps["num_lora_loads"] > 0
    assert (steps.loc[loading, "lora_load_s"] > 0).all() and (steps.loc[~loading, "lora_load_s"] == 0).all()
    assert (steps["lora_load_s"] < steps["duration"]).all()
    assert run.summary["lora"]["adapter_loads"] == lora.slots.num_slot_loads


def test_replay_of_a_lora_run_takes_the_same_decisions(lora_run, tmp_path):
    out, _ = lora_run
    result, report = run_replay(out, tmp_path / "replay")
    assert report.identical, report.describe()
    replayed, recorded = read_run(tmp_path / "replay"), read_run(out)
    assert replayed.requests["lora_name"].tolist() == recorded.requests["lora_name"].tolist()
    for column in LORA_STEP_COLUMNS:  # counted again by the replay (adapters), or copied from the recording (loads)
        assert replayed.steps[column].tolist() == recorded.steps[column].tolist(), column


def test_adapters_are_generated_once_per_shape_and_seed(tmp_path):
    from engine.models.default_model import default_model_path

    workload = load_workload(LORA)
    model_path = default_model_path("tiny")
    first = write_workload_adapters(workload, model_path, tmp_path)
    contents = {name: (path, open(f"{path}/adapter_model.safetensors", "rb").read()) for name, path in first.items()}
    assert write_workload_adapters(workload, model_path, tmp_path) == first  # found, not rewritten
    assert len({data for _, data in contents.values()}) == 3  # three different adapters
    reseeded = write_workload_adapters(load_workload(dict(LORA, seed=6)), model_path, tmp_path)
    assert not set(reseeded.values()) & set(first.values())
    assert not list(tmp_path.rglob("*.partial-*"))


def test_a_lora_run_is_retimed_on_its_adapters(lora_run, tmp_path):
    from sim.retime import retime_run

    out, _ = lora_run
    table = retime_run(out, tmp_path / "retimed", model="tiny")
    recorded = read_run(out)
    assert len(table) == len(recorded.steps) and (table["measured_s"] > 0).all()
    # The re-timed run's tables are the recording's (a text column with nulls read back by pandas included).
    assert read_run(tmp_path / "retimed").requests["lora_name"].tolist() == recorded.requests["lora_name"].tolist()


@pytest.mark.filterwarnings("ignore:.*other processes kept")  # the suite runs in parallel
def test_validate_compares_a_lora_workload_with_a_profile_fitted_on_lora_runs(lora_run, tmp_path, capsys):
    """Calibrate on two recordings (the fixture's and one of another seed), then sim.validate records a third
    workload and simulates it with that profile: its adapters priced by the profile's terms and fitted loads.
    Only the structure and a loose bound are checked: timings on a shared machine are the machine's."""
    import json

    from sim.calibrate import main as calibrate_main
    from sim.validate import main as validate_main

    out, _ = lora_run
    second = load_workload(dict(LORA, seed=6))
    real = build_real_engine(second, model="tiny", threads=1)
    run_real(second, tmp_path / "second", real.engine, vocab_size=real.vocab_size,
             reserved_token_ids=real.reserved_token_ids, executor_info=real.info, lora_paths=real.lora_paths,
             lora_manager=real.lora_manager)
    profile = tmp_path / "lora-profile.json"
    assert calibrate_main([str(out), str(tmp_path / "second"), "-o", str(profile)]) == 0
    fitted = json.loads(profile.read_text())
    assert set(fitted["features"]) & {"num_lora_tokens", "num_active_loras"}
    assert fitted["provenance"]["lora"]["max_lora_rank"] == 8 and fitted["lora_loads"]["kind"] in ("per_byte",
                                                                                                   "per_load")
    assert "LoRA (max_lora_rank 8, adapter ranks [4, 8]" in capsys.readouterr().out
    workload_file = tmp_path / "w.yaml"
    workload_file.write_text(json.dumps(dict(LORA, seed=7)))
    validated = tmp_path / "validate"
    assert validate_main([str(workload_file), "--model", "tiny", "--profile", str(profile), "--out", str(validated),
                          "--no-progress", "--no-dashboard"]) == 0
    comparison = json.loads((validated / "comparison.json").read_text())
    simulated, recorded = read_run(validated / "sim"), read_run(validated / "real")
    assert simulated.summary["num_finished"] == recorded.summary["num_finished"] == 40
    # The same request stream and adapters; the simulation counts its own adapter tokens and loads.
    assert simulated.requests["lora_name"].tolist() == recorded.requests["lora_name"].tolist()
    assert 0 < simulated.steps["num_lora_tokens"].sum() <= simulated.steps["num_scheduled_tokens"].sum()
    assert simulated.summary["lora"]["adapter_loads"] >= 3 and simulated.summary["lora"]["load_s"] > 0  # 3 adapters
    assert comparison["step_time_error"]["num_steps"] == len(recorded.steps)
    throughput = comparison["metrics"]["request_throughput"]
    assert 0.1 < throughput["sim"] / throughput["real"] < 10  # loose: a busy machine's real run may crawl
    assert "largest headline error" in capsys.readouterr().out
