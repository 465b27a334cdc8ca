"""Bad workloads are rejected with every problem named by its dotted field path and its value."""

from __future__ import annotations

import pytest

from workloads import WorkloadConfig, WorkloadError, load_workload, load_workload_text

# (id, edits, expected path in the message, expected rendering of the bad value or None)
# An edit is ("set", dotted path, value) or ("delete", dotted path).
BAD_INPUTS = [
    ("unknown key", [("set", "engine.max_num_seq", 128)], "engine.max_num_seq", "128"),
    ("unknown top-level key", [("set", "modle", "x")], "modle", "'x'"),
    ("unknown key in a union member", [("set", "workload.arrival.cv", 2)], "workload.arrival.cv", "2"),
    ("wrong type", [("set", "engine.max_num_seqs", "lots")], "engine.max_num_seqs", "'lots'"),
    ("quoted number", [("set", "workload.num_requests", "100")], "workload.num_requests", "'100'"),
    ("fractional count", [("set", "workload.num_requests", 10.5)], "workload.num_requests", "10.5"),
    ("negative rate", [("set", "workload.arrival.rate", -3)], "workload.arrival.rate", "-3"),
    ("block size not a power of two", [("set", "engine.block_size", 12)], "engine.block_size", "12"),
    ("block size too large", [("set", "engine.block_size", 512)], "engine.block_size", "512"),
    (
        "gpu memory utilization above 1",
        [("set", "engine.gpu_memory_utilization", 1.5)],
        "engine.gpu_memory_utilization",
        "1.5",
    ),
    ("too few gpu blocks", [("set", "engine.num_gpu_blocks", 1)], "engine.num_gpu_blocks", "1"),
    ("zero batched tokens", [("set", "engine.max_num_batched_tokens", 0)], "engine.max_num_batched_tokens", "0"),
    ("unknown scheduling policy", [("set", "engine.scheduling_policy", "lifo")], "engine.scheduling_policy", "'lifo'"),
    ("no replicas", [("set", "cluster.num_replicas", 0)], "cluster.num_replicas", "0"),
    ("unknown router", [("set", "cluster.router", "fastest")], "cluster.router", "'fastest'"),
    ("load gap without the router that reads it", [("set", "cluster.max_load_gap", 8)], "cluster.max_load_gap", "8"),
    (
        "negative load gap",
        [("set", "cluster.router", "prefix_aware"), ("set", "cluster.max_load_gap", -1)],
        "cluster.max_load_gap",
        "-1",
    ),
    ("load ratio without the router that reads it", [("set", "cluster.max_load_ratio", 3)], "cluster.max_load_ratio",
     "3"),
    (
        "load ratio below 1",
        [("set", "cluster.router", "lora_aware"), ("set", "cluster.max_load_ratio", 0.5)],
        "cluster.max_load_ratio",
        "0.5",
    ),
    ("min > max in a distribution", [("set", "workload.prompt_len.min", 100)], "workload.prompt_len.max", "64"),
    (
        "min > max in clipping bounds",
        [("set", "workload.output_len", {"type": "lognormal", "mean": 100, "sigma": 1, "min": 50, "max": 10})],
        "workload.output_len.max",
        "10",
    ),
    ("both num_requests and duration_s", [("set", "workload.duration_s", 60)], "workload.duration_s", "60"),
    ("neither num_requests nor duration_s", [("delete", "workload.num_requests")], "workload.num_requests", None),
    (
        "trace arrival without trace",
        [("set", "workload.arrival", {"type": "trace"})],
        "workload.arrival.type",
        "'trace'",
    ),
    (
        "trace lengths without trace",
        [("set", "workload.prompt_len", {"type": "trace"})],
        "workload.prompt_len.type",
        "'trace'",
    ),
    (
        "unknown distribution type",
        [("set", "workload.prompt_len", {"type": "zipf", "a": 1.2})],
        "workload.prompt_len.type",
        "'zipf'",
    ),
    ("distribution without type", [("set", "workload.output_len", {"mean": 3})], "workload.output_len.type", None),
    (
        "unknown arrival type",
        [("set", "workload.arrival", {"type": "poison", "rate": 1})],
        "workload.arrival.type",
        "'poison'",
    ),
    ("bad sweep key", [("set", "sweep", {"workload.arrival.rat": [1, 2]})], "sweep.workload.arrival.rat", "[1, 2]"),
    ("bad sweep value", [("set", "sweep", {"engine.block_size": [16, 24]})], "sweep.engine.block_size", "24"),
    ("empty sweep", [("set", "sweep", {"workload.arrival.rate": []})], "sweep.workload.arrival.rate", "[]"),
    ("missing name", [("delete", "name")], "name", None),
    ("unsafe name", [("set", "name", "my chat!")], "name", "'my chat!'"),
    ("hardware neither name nor mapping", [("set", "hardware", [1, 2])], "hardware", "[1, 2]"),
    # The entry at fault is named, not only the mapping's shape.
    ("hardware entry not finite", [("set", "hardware", {"name": "x", "memory_gib": float("inf")})], "hardware",
     "'memory_gib': inf"),
    ("hardware entry a boolean", [("set", "hardware", {"name": "x", "supports_bf16": False})], "hardware",
     "'supports_bf16': False"),
    ("section is not a mapping", [("set", "slo", 5)], "slo", "5"),
    ("negative slo", [("set", "slo", {"ttft_ms": -1})], "slo.ttft_ms", "-1"),
    (
        "shared prefix as long as the prompts",
        [("set", "workload.shared_prefix", {"num_groups": 2, "prefix_len": 64})],
        "workload.shared_prefix.prefix_len",
        "64",
    ),
    (
        "fraction above one",
        [("set", "workload.shared_prefix", {"num_groups": 2, "prefix_len": 4, "fraction": 1.5})],
        "workload.shared_prefix.fraction",
        "1.5",
    ),
    (
        "priority weights of the wrong length",
        [("set", "workload.priority", {"levels": [0, 1], "weights": [1]})],
        "workload.priority.weights",
        "[1.0]",
    ),
    (
        "list element of the wrong type",
        [("set", "workload.priority", {"levels": [0, "x"]})],
        "workload.priority.levels[1]",
        "'x'",
    ),
    (
        "total cap above the model length",
        [("set", "engine.max_model_len", 1024), ("set", "workload.max_total_len", 2048)],
        "workload.max_total_len",
        "2048",
    ),
    (
        "unchunked budget below the model length",
        [("set", "engine.enable_chunked_prefill", False), ("set", "engine.max_model_len", 4096)],
        "engine.max_num_batched_tokens",
        "2048",
    ),
    (
        "missing trace file",
        [("set", "workload.trace", {"path": "/nonexistent/trace.csv"})],
        "workload.trace.path",
        "'/nonexistent/trace.csv'",
    ),
    (
        "duration beyond what memory holds",
        [("delete", "workload.num_requests"), ("set", "workload.duration_s", 1e9)],
        "workload.duration_s",
        "1000000000.0",
    ),
    ("seed out of range", [("set", "seed", -1)], "seed", "-1"),
    ("not-a-number rate", [("set", "workload.arrival.rate", float("nan"))], "workload.arrival.rate", "NaN"),
]


@pytest.mark.parametrize(
    ("edits", "path", "value"), [case[1:] for case in BAD_INPUTS], ids=[case[0] for case in BAD_INPUTS]
)
def test_bad_input_names_the_field_and_the_value(raw_workload, set_path, delete_path, edits, path, value):
    for edit in edits:
        if edit[0] == "set":
            set_path(raw_workload, edit[1], edit[2])
        else:
            delete_path(raw_workload, edit[1])
    with pytest.raises(WorkloadError) as caught:
        load_workload(raw_workload)
    lines = [str(problem) for problem in caught.value.problems]
    matching = [line for line in lines if line.startswith(f"{path}: ")]
    assert matching, f"no problem at {path!r} in {lines}"
    if value is not None:
        assert any(f"(got {value})" in line or f" {value}" in line for line in matching), matching
    assert all(line in str(caught.value) for line in lines)


def test_block_size_message_reads_as_documented(raw_workload, set_path):
    set_path(raw_workload, "engine.block_size", 12)
    with pytest.raises(WorkloadError, match=r"engine\.block_size: must be a positive power of two \(got 12\)"):
        load_workload(raw_workload)


def test_misspelled_key_suggests_the_right_one(raw_workload, set_path):
    set_path(raw_workload, "engine.max_num_seq", 128)
    with pytest.raises(WorkloadError, match="did you mean 'max_num_seqs'"):
        load_workload(raw_workload)


def test_every_problem_is_listed(raw_workload, set_path):
    set_path(raw_workload, "engine.block_size", 12)
    set_path(raw_workload, "engine.max_num_seqs", 0)
    set_path(raw_workload, "workload.arrival.rate", 0)
    with pytest.raises(WorkloadError) as caught:
        load_workload(raw_workload)
    paths = [problem.path for problem in caught.value.problems]
    assert paths == ["engine.block_size", "engine.max_num_seqs", "workload.arrival.rate"]
    assert isinstance(caught.value, ValueError)


def test_malformed_yaml_names_the_file_and_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: broken\nworkload:\n  arrival: {type: poisson\n  rate: 3\n")
    with pytest.raises(WorkloadError) as caught:
        load_workload(path)
    message = str(caught.value)
    assert str(path) in message and "line 4" in message


def test_duplicate_yaml_key_is_an_error():
    with pytest.raises(WorkloadError, match="duplicate key 'name'"):
        load_workload_text("name: a\nname: b\n")


def test_workload_that_is_not_a_mapping():
    with pytest.raises(WorkloadError, match="must be a mapping"):
        load_workload_text("- 1\n- 2\n")


def test_missing_workload_file():
    with pytest.raises(WorkloadError, match="cannot read the workload file"):
        load_workload("/nonexistent/workload.yaml")


def test_a_workload_file_that_is_not_utf8_is_named(tmp_path):
    # Saved as UTF-16 (with its byte-order mark), as Windows editors do: the bare codec error named no file.
    path = tmp_path / "chat.yaml"
    path.write_text("name: chat\n", encoding="utf-16")
    with pytest.raises(WorkloadError, match=rf"{path}: cannot read the workload file \(not UTF-8 text: "
                                            r"invalid start byte at byte 0\)"):
        load_workload(path)


@pytest.mark.parametrize(
    ("override", "path"),
    [
        ("engine.max_num_seq=128", "engine.max_num_seq"),
        ("workload.arival.rate=3", "workload.arival"),
        ("engine.block_size.x=1", "engine.block_size"),
        ("hardware.peak_tflops=900", "hardware"),
    ],
)
def test_bad_override_path_is_named(raw_workload, override, path):
    raw_workload["hardware"] = "h100-sxm"  # a preset name has no keys to override
    with pytest.raises(WorkloadError) as caught:
        load_workload(raw_workload, [override])
    assert caught.value.problems[0].path == path
    assert path in str(caught.value)


def test_override_without_equals_sign(raw_workload):
    with pytest.raises(WorkloadError, match="path.to.key=value"):
        load_workload(raw_workload, ["engine.max_num_seqs"])


def test_override_value_is_validated_like_the_file(raw_workload):
    with pytest.raises(WorkloadError, match=r"engine\.block_size: must be a positive power of two \(got 12\)"):
        load_workload(raw_workload, ["engine.block_size=12"])


def test_direct_construction_reports_pydantic_errors_with_paths(raw_workload, set_path):
    # Validating without load_workload still refuses, and the message still carries the paths.
    set_path(raw_workload, "workload.duration_s", 10)
    with pytest.raises(ValueError, match="duration_s"):
        WorkloadConfig.model_validate(raw_workload)
