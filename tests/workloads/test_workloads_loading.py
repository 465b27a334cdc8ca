"""Loading, overrides, sweeps, serialization, and the shipped examples."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from workloads import (
    EngineSection,
    SLOSection,
    WorkloadConfig,
    WorkloadError,
    example_path,
    generate_requests,
    list_examples,
    load_workload,
    parse_override,
)

EXPECTED_EXAMPLES = {"chat", "code_trace", "conversation_trace", "mooncake", "rate_sweep", "priority", "cluster_routing",
                     "disaggregation", "parallelism", "moe", "spec_decode", "request_classes", "multi_lora",
                     "scheduling_policies", "multi_turn", "concurrency_sweep", "sliding_window", "autoscaling", "hybrid_kv_cache", "prefix_cache_eviction",
                     "multimodal", "deepseek", "gpt_oss", "deepseek_data_parallel", "llama4_long_context"}


def test_examples_are_listed():
    assert EXPECTED_EXAMPLES <= set(list_examples())
    assert example_path("chat") == example_path("chat.yaml")
    with pytest.raises(WorkloadError, match="no such example"):
        example_path("nope")


@pytest.mark.parametrize("name", sorted(EXPECTED_EXAMPLES))
def test_every_example_loads_and_generates(name):
    config = load_workload(example_path(name))
    assert config.name == name
    points = config.sweep_points()
    label, point = points[0]
    requests = generate_requests(point, vocab_size=32000, reserved_token_ids=[0, 1, 2])
    assert requests
    # Every class's count (workload.classes), where each gives one.
    counts = [point.workload.num_requests, *(c.num_requests for c in point.workload.classes or [])]
    assert None in counts or len(requests) == sum(counts)
    assert all(a.arrival_time <= b.arrival_time for a, b in zip(requests, requests[1:]))
    cap = point.max_total_len()
    assert cap is None or all(request.total_len <= cap for request in requests)


def test_defaults_fill_the_engine_section(raw_workload):
    config = load_workload(raw_workload)
    assert isinstance(config.engine, EngineSection)
    assert config.engine.block_size == 16 and config.engine.scheduling_policy == "fcfs"
    assert config.model == "llama-3-8b" and config.hardware == "h100-sxm" and config.dtype == "bfloat16"
    assert config.slo is None and config.sweep is None


def test_inline_hardware_mapping_is_kept_for_the_simulator(raw_workload):
    raw_workload["hardware"] = {"name": "my-gpu", "peak_tflops": 400, "memory_bandwidth_gbs": 2000, "memory_gb": 48}
    config = load_workload(raw_workload)
    assert config.hardware["peak_tflops"] == 400 and config.hardware["name"] == "my-gpu"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("engine.max_num_seqs=128", ("engine.max_num_seqs", 128)),
        ("workload.arrival.rate=0.5", ("workload.arrival.rate", 0.5)),
        ("engine.enable_prefix_caching=false", ("engine.enable_prefix_caching", False)),
        ("engine.max_model_len=null", ("engine.max_model_len", None)),
        ("workload.priority.levels=[0, 1]", ("workload.priority.levels", [0, 1])),
        ("name = spaced ", ("name", "spaced")),
        # Exponent notation is a number, as in YAML 1.2 (PyYAML's YAML 1.1 read "1e3" as a string).
        ("workload.arrival.rate=1e3", ("workload.arrival.rate", 1000.0)),
        ("workload.trace.time_scale=1.5e-3", ("workload.trace.time_scale", 0.0015)),
        ("name=1e3x", ("name", "1e3x")),
    ],
)
def test_override_values_are_parsed_as_yaml(text, expected):
    assert parse_override(text) == expected


def test_overrides_apply_before_validation_and_create_sections(raw_workload):
    config = load_workload(
        raw_workload,
        ["engine.max_num_seqs=128", "slo.ttft_ms=300", "workload.arrival={type: gamma, rate: 4, cv: 2}"],
    )
    assert config.engine.max_num_seqs == 128
    assert config.slo == SLOSection(ttft_ms=300)
    assert config.slo.thresholds() == {"ttft_ms": 300}
    assert config.workload.arrival.type == "gamma" and config.workload.arrival.cv == 2


def test_with_overrides_returns_a_new_valid_config(raw_workload):
    config = load_workload(raw_workload)
    changed = config.with_overrides(["workload.arrival.rate=9"])
    assert changed.workload.arrival.rate == 9 and config.workload.arrival.rate == 5
    with pytest.raises(WorkloadError, match="workload.arrival.rate"):
        config.with_overrides(["workload.arrival.rate=-1"])


def test_to_dict_is_json_safe_and_round_trips():
    config = load_workload(example_path("rate_sweep"))
    as_dict = config.to_dict()
    assert json.loads(json.dumps(as_dict)) == as_dict
    assert WorkloadConfig.model_validate(as_dict) == config


def test_sweep_points_over_rates():
    config = load_workload(example_path("rate_sweep"))
    points = config.sweep_points()
    assert [label for label, _ in points] == ["rate=2", "rate=4", "rate=8", "rate=16", "rate=32"]
    assert [point.workload.arrival.rate for _, point in points] == [2, 4, 8, 16, 32]
    assert all(point.sweep is None and point.name == config.name for _, point in points)


def test_sweep_with_two_keys_is_a_cartesian_product(raw_workload):
    raw_workload["sweep"] = {"workload.arrival.rate": [1, 2], "engine.max_num_seqs": [8, 16, 32]}
    points = load_workload(raw_workload).sweep_points()
    assert len(points) == 6
    assert points[0][0] == "rate=1,max_num_seqs=8"
    assert {(p.workload.arrival.rate, p.engine.max_num_seqs) for _, p in points} == {
        (rate, seqs) for rate in (1, 2) for seqs in (8, 16, 32)
    }


def test_sweep_labels_tell_equal_leaf_names_apart(raw_workload):
    raw_workload["workload"]["output_len"] = {"type": "uniform", "min": 1, "max": 32}
    raw_workload["sweep"] = {"workload.prompt_len.max": [64, 128], "workload.output_len.max": [32]}
    labels = [label for label, _ in load_workload(raw_workload).sweep_points()]
    assert labels == ["prompt_len.max=64,output_len.max=32", "prompt_len.max=128,output_len.max=32"]


def test_sweep_over_whole_sections_has_readable_labels(raw_workload):
    raw_workload["sweep"] = {
        "workload.prompt_len": [{"type": "constant", "value": 5}, {"type": "uniform", "min": 1, "max": 3}]
    }
    points = load_workload(raw_workload).sweep_points()
    assert [label for label, _ in points] == ["prompt_len=constant-5", "prompt_len=uniform-1-3"]
    assert points[1][1].workload.prompt_len.type == "uniform"


def test_sections_that_would_read_alike_are_labelled_by_what_differs(raw_workload):
    # By values alone, {tensor_parallel_size: 4} and {pipeline_parallel_size: 4} both read "4096-4".
    raw_workload["sweep"] = {"engine": [
        {"max_model_len": 4096, "tensor_parallel_size": 4},
        {"max_model_len": 4096, "tensor_parallel_size": 2, "pipeline_parallel_size": 2},
        {"max_model_len": 4096, "pipeline_parallel_size": 4},
    ]}
    points = load_workload(raw_workload).sweep_points()
    assert [label for label, _ in points] == [
        "engine=tensor_parallel_size=4", "engine=tensor_parallel_size=2+pipeline_parallel_size=2",
        "engine=pipeline_parallel_size=4"]
    assert [(config.engine.tensor_parallel_size, config.engine.pipeline_parallel_size) for _, config in points] == \
        [(4, 1), (2, 2), (1, 4)]


def test_no_sweep_gives_one_base_point(raw_workload):
    config = load_workload(raw_workload)
    assert config.sweep_points() == [("base", config)]


def test_relative_trace_path_resolves_against_the_yaml_directory(tmp_path, data_dir):
    (tmp_path / "traces").mkdir()
    (tmp_path / "workloads").mkdir()
    shutil.copy(data_dir / "splitwise_code_sample.csv", tmp_path / "traces" / "code.csv")
    workload = {
        "name": "relative",
        "workload": {
            "num_requests": 10,
            "arrival": {"type": "trace"},
            "prompt_len": {"type": "trace"},
            "output_len": {"type": "trace"},
            "trace": {"path": "../traces/code.csv"},
        },
    }
    path = tmp_path / "workloads" / "relative.yaml"
    path.write_text(yaml.safe_dump(workload))
    config = load_workload(path)
    assert config.workload.trace.path == str((tmp_path / "traces" / "code.csv").resolve())
    assert len(generate_requests(config, vocab_size=1000)) == 10


def test_sweep_over_trace_files_resolves_them_against_the_yaml_directory(tmp_path, data_dir, monkeypatch):
    # Run from elsewhere, as `python -m sim.run other/dir/sweep.yaml` is: each file a sweep tries is found
    # where the base trace is, and the labels name the files, not the absolute paths the loader made.
    for folder in ("a", "b"):
        (tmp_path / "traces" / folder).mkdir(parents=True)
        shutil.copy(data_dir / "splitwise_code_sample.csv", tmp_path / "traces" / folder / "code.csv")
    shutil.copy(data_dir / "mooncake_conversation_sample.jsonl", tmp_path / "traces" / "chat.jsonl")
    trace_section = {"type": "trace"}
    workload = {
        "name": "trace_sweep",
        "workload": {"num_requests": 5, "arrival": trace_section, "prompt_len": trace_section,
                     "output_len": trace_section, "trace": {"path": "traces/a/code.csv"}},
        "sweep": {"workload.trace.path": ["traces/a/code.csv", "traces/b/code.csv", "traces/chat.jsonl"]},
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(workload))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    points = load_workload(path).sweep_points()
    assert [label for label, _ in points] == ["path=a_code.csv", "path=b_code.csv", "path=chat.jsonl"]
    assert [point.workload.trace.path for _, point in points] == [
        str((tmp_path / "traces" / name).resolve()) for name in ("a/code.csv", "b/code.csv", "chat.jsonl")
    ]


def test_sweep_over_whole_trace_sections_resolves_their_paths(tmp_path, data_dir, monkeypatch):
    shutil.copy(data_dir / "splitwise_code_sample.csv", tmp_path / "code.csv")
    trace_section = {"type": "trace"}
    workload = {
        "name": "trace_sections",
        "workload": {"num_requests": 5, "arrival": trace_section, "prompt_len": trace_section,
                     "output_len": trace_section, "trace": {"path": "code.csv"}},
        "sweep": {"workload.trace": [{"path": "code.csv", "time_scale": 1.0}, {"path": "code.csv", "time_scale": 0.5}]},
    }
    path = tmp_path / "sections.yaml"
    path.write_text(yaml.safe_dump(workload))
    monkeypatch.chdir("/")
    points = load_workload(path).sweep_points()
    assert {point.workload.trace.path for _, point in points} == {str((tmp_path / "code.csv").resolve())}
    assert len({label for label, _ in points}) == 2


def test_sweep_values_that_read_alike_get_one_label_each(raw_workload):
    raw_workload["sweep"] = {"description": ["a b", "a_b", "a+b"]}
    labels = [label for label, _ in load_workload(raw_workload).sweep_points()]
    assert labels == ["description=a_b", "description=a_b-2", "description=a+b"]


def test_exponent_notation_in_a_workload_file_is_a_number(tmp_path, raw_workload):
    text = yaml.safe_dump(raw_workload).replace("rate: 5.0", "rate: 5e1")
    assert "rate: 5e1" in text
    path = tmp_path / "exponent.yaml"
    path.write_text(text)
    assert load_workload(path).workload.arrival.rate == 50.0
