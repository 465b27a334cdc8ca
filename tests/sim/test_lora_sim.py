"""Multi-LoRA serving in the simulator: adapter slots, loads, the adapters' kernels, traces and refusals."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis import requests_table, steps_table
from engine.core import EngineCore, Scheduler
from sim.cost_models import StepFeatures
from sim.engine_setup import SetupError, build_setup
from sim.lora_adapters import adapter_bytes
from sim.lora_slots import AdapterLoad, LoRASlots
from sim.lora_steps import LoRASteps
from sim.model_presets import resolve_model
from sim.profile_match import SHIPPED_PROFILES_DIR
from sim.run_pipeline import run_simulation, simulate
from sim.sim_executor import SimulatedExecutor
from sim.simulator import Simulation
from workloads import example_path, load_workload
from workloads.lora_section import AdapterSpec, LORA_TARGET_MODULES

SMALL = ["workload.num_requests=200"]


def multi_lora(*overrides):
    return load_workload(example_path("multi_lora"), overrides=[*SMALL, *overrides])


def traces(workload, fast_forward=True):
    """(requests, steps, fast-forwarded steps) of a one-engine run, as tests/sim/test_fast_forward_equivalence.py."""
    setup = build_setup(workload)
    executor = SimulatedExecutor(setup.cost_model)
    executor.lora = None if setup.lora is None else LoRASteps(setup.lora)
    engine = EngineCore(Scheduler(setup.scheduler_config, setup.cache_config), executor)
    simulation = Simulation(engine, setup.requests, fast_forward=fast_forward)
    recorder = simulation.run()
    return (requests_table(recorder.request_columns()).to_pandas(), steps_table(recorder.step_columns()).to_pandas(),
            simulation.num_fast_forwarded_steps)


# --- the slots ------------------------------------------------------------------------------------------------

def test_device_slots_and_host_cache_are_lru_by_step():
    slots = LoRASlots(max_loras=2, max_cpu_loras=3)
    loads = [slots.admit(batch, step) for step, batch in enumerate([{1}, {2}, {3}, {1}, {4}, {1}, {2}, {3}, {1, 3}])]
    assert loads == [
        [AdapterLoad(1, True)], [AdapterLoad(2, True)],
        [AdapterLoad(3, True)],        # evicts 1 from the device (least recent); the host keeps 1, 2, 3
        [AdapterLoad(1, False)],       # back from the host: a copy, no disk read; evicts 2 from the device
        [AdapterLoad(4, True)],        # the host's least recent is 2: gone; the device's is 3
        [],                            # 1 is still on the device
        [AdapterLoad(2, True)],        # 2 left the host at step 4: read from disk again
        [AdapterLoad(3, True)],        # 3 left the host at step 6 (least recent there); 1 leaves the device
        [AdapterLoad(1, False)],       # 1 is still in host memory; 3, of the batch too, stays on the device
    ]
    assert set(slots.device) == {1, 3} and len(slots.host) == 3


def test_an_adapter_of_the_batch_is_never_evicted_and_a_host_eviction_frees_its_slot():
    slots = LoRASlots(max_loras=2, max_cpu_loras=2)
    slots.admit({1, 2}, 0)
    assert slots.admit({2, 3}, 1) == [AdapterLoad(3, True)]  # 1 goes, though 2 was used in the same step
    assert set(slots.device) == set(slots.host) == {2, 3}
    with pytest.raises(ValueError, match="more than max_loras 2"):
        slots.admit({1, 2, 3}, 2)


# --- bytes and load times -------------------------------------------------------------------------------------

def test_adapter_bytes_follow_the_module_shapes():
    model = resolve_model("llama-3-8b")  # hidden 4096, 8 KV heads of 128 (GQA: k and v are 1024 wide), MLP 14336
    adapter = AdapterSpec("a", 1, 16, LORA_TARGET_MODULES)
    in_plus_out = (4096 + 4096) + 2 * (4096 + 1024) + (4096 + 4096) + 2 * (4096 + 14336) + (14336 + 4096)
    assert adapter_bytes(model, adapter, "bfloat16") == 16 * in_plus_out * 32 * 2
    attention = AdapterSpec("a", 1, 8, ("q_proj", "v_proj"))
    assert adapter_bytes(model, attention, "bfloat16") == 8 * (8192 + 5120) * 32 * 2
    # Tensor parallelism: each GPU holds the whole A of a column-parallel projection and half its B.
    assert adapter_bytes(model.shard(2), attention, "bfloat16") == 8 * (4096 + 2048 + 4096 + 512) * 32 * 2


def test_a_steps_load_takes_the_adapters_bytes_over_the_link_and_from_disk():
    workload = multi_lora("workload.num_requests=1", "workload.lora.adapters=1", "workload.lora.base_model_fraction=0",
                          "workload.lora.rank=8", "workload.lora.target_modules=[q_proj, v_proj]",
                          "hardware={preset: h100-sxm, host_link_bandwidth_gbps: 10, disk_read_bandwidth_gbps: 2}")
    requests, steps, _ = traces(workload)
    num_bytes = 8 * (8192 + 5120) * 32 * 2
    expected = num_bytes / (10e9 * 0.8) + num_bytes / 2e9  # the copy at 80% of the link, then the disk read
    assert steps["num_lora_loads"].tolist()[0] == steps["num_lora_disk_loads"].tolist()[0] == 1
    assert steps["lora_load_s"].tolist()[0] == pytest.approx(expected, rel=1e-12)
    assert steps["num_lora_loads"].sum() == 1 and steps["lora_load_s"].tolist()[1:] == [0.0] * (len(steps) - 1)
    setup = build_setup(workload)
    features = StepFeatures(num_reqs=1, num_tokens=int(steps["num_scheduled_tokens"][0]), num_prefill_reqs=1,
                            num_prefill_tokens=int(steps["num_prefill_tokens"][0]), num_decode_reqs=0,
                            decode_context_tokens=0, prefill_context_tokens=0,
                            prefill_attention_work=int(steps["prefill_attention_work"][0]),
                            max_seq_len=int(steps["max_seq_len"][0]), prefill_attention_dense_work=0,
                            num_lora_tokens=int(steps["num_scheduled_tokens"][0]), num_active_loras=1)
    features.prefill_attention_dense_work = int(steps["prefill_attention_dense_work"][0])
    features.prefill_attention_sliced_work = int(steps["prefill_attention_sliced_work"][0])
    assert steps["duration"][0] == pytest.approx(setup.cost_model.step_time_from_features(features) + expected,
                                                 rel=1e-12)
    assert requests["lora_name"].tolist() == ["adapter-0"]


# --- the adapters' kernels --------------------------------------------------------------------------------------

def test_adapter_tokens_cost_more_and_distinct_adapters_more_at_small_batches():
    model = build_setup(multi_lora()).cost_model
    decode = dict(num_reqs=16, num_tokens=16, num_prefill_reqs=0, num_prefill_tokens=0, num_decode_reqs=16,
                  decode_context_tokens=16 * 600, prefill_context_tokens=0, prefill_attention_work=0, max_seq_len=600)
    base = model.step_time_from_features(StepFeatures(**decode))
    one = model.step_time_from_features(StepFeatures(**decode, num_lora_tokens=16, num_active_loras=1))
    sixteen = model.step_time_from_features(StepFeatures(**decode, num_lora_tokens=16, num_active_loras=16))
    assert base < one < sixteen
    # 16 rank-16 adapters of every projection: 16 x 84 MB read, about 0.5 ms on an H100 at 75% of its bandwidth.
    lora = model.lora
    assert sixteen - one == pytest.approx(15 * lora.weight_read_s_per_adapter, rel=1e-9)
    assert lora.weight_read_s_per_adapter == pytest.approx(16 * 81920 * 32 * 2 / (3350e9 * 0.75), rel=1e-9)
    # The slot's rank prices the kernels: a smaller adapter is padded into it.
    wide = build_setup(multi_lora("engine.max_lora_rank=64")).cost_model
    assert wide.lora.weight_read_s_per_adapter == pytest.approx(4 * lora.weight_read_s_per_adapter)


def test_without_adapter_tokens_every_step_costs_what_it_did():
    plain = load_workload(example_path("chat"), overrides=SMALL)
    all_base = load_workload(example_path("chat"), overrides=[
        *SMALL, "engine.max_loras=4", "workload.lora={adapters: 8, base_model_fraction: 1.0}"])
    requests_plain, steps_plain, _ = traces(plain)
    requests_base, steps_base, _ = traces(all_base)
    assert steps_base["num_lora_tokens"].sum() == 0 and steps_base["num_lora_loads"].sum() == 0
    pd.testing.assert_frame_equal(steps_base.drop(columns=list(steps_base.columns.difference(steps_plain.columns))),
                                  steps_plain, check_exact=True)
    pd.testing.assert_frame_equal(requests_base.drop(columns=["lora_name"]), requests_plain, check_exact=True)


# --- the scheduler's rule, the fast-forward, more slots -----------------------------------------------------------

@pytest.mark.parametrize("max_loras", [1, 2, 4])
def test_no_step_uses_more_adapters_than_the_slots(max_loras):
    requests, steps, _ = traces(multi_lora(f"engine.max_loras={max_loras}"))
    assert steps["num_active_loras"].max() == max_loras
    assert requests["finish_reason"].eq("length").all()


@pytest.mark.parametrize("overrides", [
    [],
    ["engine.max_loras=1", "engine.max_cpu_loras=2"],                     # loads in decode stretches
    ["workload.lora.popularity=uniform", "engine.max_loras=8", "workload.lora.rank=[8, 16]"],
    ["engine.num_gpu_blocks=400", "workload.arrival.rate=30"],              # preemption
])
def test_traces_are_identical_with_and_without_fast_forward(overrides):
    workload = multi_lora(*overrides)
    requests_on, steps_on, fast_forwarded = traces(workload, True)
    requests_off, steps_off, none = traces(workload, False)
    assert none == 0 and fast_forwarded > 0
    assert steps_on["num_lora_tokens"].sum() > 0
    pd.testing.assert_frame_equal(requests_on, requests_off, check_exact=True)
    pd.testing.assert_frame_equal(steps_on, steps_off, check_exact=True)


def test_slots_for_every_adapter_load_each_once_and_fewer_slots_reload():
    # Eight equally popular adapters at a light load, all in host memory once read. With a slot for each, every
    # adapter is loaded once; with fewer they are evicted and copied back. (Not monotonic in between: one slot
    # makes the scheduler serve one adapter's requests together, vLLM's rule, which loads less than four slots
    # shared by eight adapters, and waits longer.)
    loads = {}
    for max_loras in (1, 2, 4, 8):
        _, steps, _ = traces(multi_lora("workload.lora={adapters: 8, popularity: uniform}", "engine.max_cpu_loras=8",
                                        "workload.arrival.rate=2", f"engine.max_loras={max_loras}"))
        loads[max_loras] = (int(steps["num_lora_loads"].sum()), int(steps["num_lora_disk_loads"].sum()))
    assert loads[8][0] == 8 and min(loads[m][0] for m in (1, 2, 4)) > 2 * 8
    assert {disk for _, disk in loads.values()} == {8}  # each read from disk once: the host holds them all


# --- outputs, clusters, refusals -----------------------------------------------------------------------------------

def test_a_run_reports_its_adapters(tmp_path):
    result = run_simulation(multi_lora(), tmp_path / "run")
    lora = result.summary["lora"]
    steps = pd.read_parquet(tmp_path / "run" / "steps.parquet")
    requests = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    assert lora["adapter_loads"] == steps["num_lora_loads"].sum() > 0
    assert lora["load_share_of_step_time"] == pytest.approx(steps["lora_load_s"].sum() / steps["duration"].sum())
    assert lora["num_lora_requests"] + lora["num_base_model_requests"] == 200 == len(requests)
    assert lora["top_adapters"][0]["lora_name"] == "adapter-0"
    assert lora["num_base_model_requests"] == requests["lora_name"].isna().sum() > 0
    assert result.summary["config"]["lora"]["max_loras"] == 4
    from analysis.report import summary_renderable
    from rich.console import Console

    console = Console(record=True, width=200)
    console.print(summary_renderable(result.summary))
    assert "LoRA (" in console.export_text()


def test_a_cluster_gives_each_replica_its_own_slots():
    workload = multi_lora("cluster={num_replicas: 2, router: round_robin}")
    recorder = simulate(build_setup(workload))
    steps = steps_table(recorder.step_columns()).to_pandas()
    # Each replica reads every adapter it serves from disk once at least: more loads than one engine's.
    assert steps.groupby("replica")["num_lora_disk_loads"].sum().min() > 0
    assert steps["num_active_loras"].max() <= 4


@pytest.mark.parametrize("overrides, expected", [
    (["engine.pipeline_parallel_size=2"], "not simulated with engine.pipeline_parallel_size 2"),
    (["engine.async_scheduling=true"], "not simulated with engine.async_scheduling: true"),
    (["engine.speculative_decoding={num_speculative_tokens: 2, acceptance_rate: 0.5}"],
     "not simulated with engine.speculative_decoding"),
    (["cluster={num_replicas: 2, prefill_replicas: 1}"], "not simulated with cluster.prefill_replicas 1"),
    (["hardware={name: gpu, dense_fp16_tflops: 100, fp32_tflops: 10, memory_bandwidth_gbps: 1000, memory_gib: 80}"],
     "names no host link"),
    (["model=mixtral-8x7b", "engine.tensor_parallel_size=2"], "target_modules"),
    (["model=deepseek-v2-lite"], "multi-head latent attention"),
])
def test_what_is_not_simulated_with_lora_is_refused_by_name(overrides, expected):
    with pytest.raises(SetupError, match=r"^workload\.lora") as error:
        build_setup(multi_lora(*overrides))
    assert expected in str(error.value)


def test_a_calibrated_profile_refuses_lora():
    workload = load_workload(example_path("cpu_chat"), overrides=[
        "engine.max_loras=2", "workload.lora={adapters: 4}"])
    with pytest.raises(SetupError, match=r"^workload\.lora: LoRA adapters need the analytical cost model"):
        build_setup(workload, str(SHIPPED_PROFILES_DIR / "cpu-small-float32.json"))


def test_validate_refuses_lora_without_a_profile(capsys):
    from sim.validate import main as validate_main

    assert validate_main(["multi_lora", "--out", "/nonexistent/never"]) == 2
    assert "workload.lora: a LoRA workload is compared by sim.validate only with --profile" in capsys.readouterr().err


def test_a_fast_forward_counts_its_steps_adapters_and_loads_only_in_its_first_step():
    from types import SimpleNamespace

    from engine.core import LoRARequest
    from sim.lora_adapters import LoRASetup

    setup = LoRASetup(max_loras=2, max_cpu_loras=3, max_lora_rank=16, copy_s={1: 1.0, 2: 2.0, 3: 4.0},
                      disk_read_s={1: 10.0, 2: 20.0, 3: 40.0}, names={1: "a", 2: "b", 3: "c"})
    lora = LoRASteps(setup)
    lora.slots.admit({1, 3}, 0)
    lora.slots.admit({1}, 1)
    lora.num_steps = 2
    # Running: two requests of adapter 1 (decoding in steps 0..4 and 0..1), one of adapter 2 (0..2), one base.
    requests = [SimpleNamespace(lora_request=LoRARequest("a", 1)), SimpleNamespace(lora_request=LoRARequest("b", 2)),
                SimpleNamespace(lora_request=None), SimpleNamespace(lora_request=LoRARequest("a", 1))]
    plan = lora.plan_fast_forward(requests, [4, 2, 9, 1])
    assert [plan.counts(step) for step in range(6)] == [(3, 2), (3, 2), (2, 2), (1, 1), (1, 1), (0, 0)]
    assert plan.first_load_s == 2.0 + 20.0  # adapter 2: read from disk, then copied; 3 leaves the device
    assert lora.slots.device == {1: 1, 3: 0}  # planning changes nothing
    lora.commit_fast_forward(plan, num_steps=4)
    assert (lora.last_num_loads, lora.last_num_disk_loads, lora.last_load_s) == (1, 1, 22.0)
    # As four ordinary steps leave them: adapter 1 last ran in step 3 of the stretch, adapter 2 in step 2.
    assert lora.slots.device == {1: 5, 2: 4} and lora.slots.host == {1: 5, 2: 4, 3: 0} and lora.num_steps == 6


def test_the_dashboard_shows_the_adapters(tmp_path):
    from sim.run import main

    assert main(["multi_lora", "--set", "workload.num_requests=100", "--out", str(tmp_path / "run"), "--quiet"]) == 0
    page = (tmp_path / "run" / "dashboard.html").read_text()
    assert "LoRA adapter loads" in page and "step time loading adapters" in page
