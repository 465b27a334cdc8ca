"""Request classes (workload.classes): concurrent streams, each of its own, merged by arrival time."""

from __future__ import annotations

import copy

import pytest

from analysis.trace_schema import DEFAULT_REQUEST_CLASS as ANALYSIS_DEFAULT_CLASS
from workloads import WorkloadError, generate_requests, load_workload
from workloads.request_spec import DEFAULT_REQUEST_CLASS

VOCAB_SIZE = 1000
BATCH = {"name": "batch", "num_requests": 30, "start_s": 5.0, "arrival": {"type": "poisson", "rate": 2.0},
         "prompt_len": {"type": "uniform", "min": 300, "max": 400}, "output_len": {"type": "constant", "value": 50},
         "priority": {"levels": [1]}, "slo": {"e2e_ms": 60000}}
SUMMARIES = dict(BATCH, name="summaries", start_s=0.0, num_requests=10, prompt_len={"type": "constant", "value": 900})


def with_classes(raw, *classes, class_name=None):
    raw = copy.deepcopy(raw)
    raw["workload"]["classes"] = [copy.deepcopy(request_class) for request_class in classes]
    if class_name is not None:
        raw["workload"]["class_name"] = class_name
    return raw


def by_class(requests):
    grouped = {}
    for request in requests:
        grouped.setdefault(request.request_class, []).append(request)
    return grouped


def without_ids(requests):
    return [(r.arrival_time, r.prompt_token_ids, r.output_len, r.priority, r.prefix_group, r.request_class)
            for r in requests]


def test_the_default_class_name_is_the_same_in_workloads_and_analysis():
    # analysis reads a trace without the column as this class; workloads names an unclassed stream so.
    assert DEFAULT_REQUEST_CLASS == ANALYSIS_DEFAULT_CLASS == "default"


def test_a_workload_without_classes_is_one_default_class_and_unchanged(raw_workload):
    requests = generate_requests(load_workload(raw_workload), VOCAB_SIZE)
    assert {r.request_class for r in requests} == {"default"}
    # class_name only names the stream: the same requests, renamed.
    raw_workload["workload"]["class_name"] = "chat"
    renamed = generate_requests(load_workload(raw_workload), VOCAB_SIZE)
    assert {r.request_class for r in renamed} == {"chat"}
    assert [(r.request_id, r.arrival_time, r.prompt_token_ids) for r in renamed] == \
           [(r.request_id, r.arrival_time, r.prompt_token_ids) for r in requests]


def test_classes_merge_by_arrival_with_ids_in_merged_order(raw_workload):
    requests = generate_requests(load_workload(with_classes(raw_workload, BATCH, class_name="chat")), VOCAB_SIZE)
    assert len(requests) == 230
    assert [r.request_id for r in requests] == [f"req-{index:06d}" for index in range(230)]
    assert all(a.arrival_time <= b.arrival_time for a, b in zip(requests, requests[1:]))
    classes = by_class(requests)
    assert set(classes) == {"chat", "batch"} and len(classes["chat"]) == 200 and len(classes["batch"]) == 30
    # Interleaved, not one after the other; the batch class's first arrival is at its start_s.
    positions = [index for index, r in enumerate(requests) if r.request_class == "batch"]
    assert positions[0] > 0 and positions[-1] < 229
    assert classes["batch"][0].arrival_time == pytest.approx(5.0)
    assert all(300 <= r.num_prompt_tokens <= 400 and r.output_len == 50 and r.priority == 1 for r in classes["batch"])
    assert all(8 <= r.num_prompt_tokens <= 64 and r.priority == 0 for r in classes["chat"])


def test_adding_a_class_leaves_every_other_class_unchanged(raw_workload):
    alone = generate_requests(load_workload(raw_workload), VOCAB_SIZE)
    one = generate_requests(load_workload(with_classes(raw_workload, BATCH)), VOCAB_SIZE)
    two = generate_requests(load_workload(with_classes(raw_workload, BATCH, SUMMARIES)), VOCAB_SIZE)
    # The top-level class draws what it drew alone; the first further class what it drew beside it alone
    # (ids aside: they number the merged stream).
    assert without_ids(by_class(one)["default"]) == without_ids(alone)
    assert without_ids(by_class(two)["default"]) == without_ids(alone)
    assert without_ids(by_class(two)["batch"]) == without_ids(by_class(one)["batch"])
    # Deterministic: the same workload, the same requests, ids included.
    assert generate_requests(load_workload(with_classes(raw_workload, BATCH, SUMMARIES)), VOCAB_SIZE) == two


def test_classes_with_the_same_settings_draw_different_requests(raw_workload):
    twin = dict(BATCH, name="batch_2")
    requests = by_class(generate_requests(load_workload(with_classes(raw_workload, BATCH, twin)), VOCAB_SIZE))
    assert [r.prompt_token_ids for r in requests["batch"]] != [r.prompt_token_ids for r in requests["batch_2"]]
    assert [r.arrival_time for r in requests["batch"]] != [r.arrival_time for r in requests["batch_2"]]


def test_a_class_rate_changes_only_that_class(raw_workload):
    base = by_class(generate_requests(load_workload(with_classes(raw_workload, BATCH)), VOCAB_SIZE))
    faster = by_class(generate_requests(load_workload(with_classes(raw_workload, dict(BATCH, arrival={
        "type": "poisson", "rate": 4.0}))), VOCAB_SIZE))
    assert without_ids(faster["default"]) == without_ids(base["default"])
    # The same requests at twice the rate: only their times change.
    assert [r.prompt_token_ids for r in faster["batch"]] == [r.prompt_token_ids for r in base["batch"]]
    assert [r.arrival_time - 5.0 for r in faster["batch"]] == pytest.approx(
        [(r.arrival_time - 5.0) / 2 for r in base["batch"]])


def test_class_slos_replace_the_top_level_one(raw_workload):
    raw = with_classes(raw_workload, BATCH, dict(SUMMARIES, slo=None), class_name="chat")
    raw["slo"] = {"ttft_ms": 200, "tpot_ms": 40}
    assert load_workload(raw).class_slos() == {"chat": {"ttft_ms": 200.0, "tpot_ms": 40.0},
                                               "batch": {"e2e_ms": 60000.0},
                                               "summaries": {"ttft_ms": 200.0, "tpot_ms": 40.0}}
    assert load_workload(raw_workload).class_slos() == {"default": {}}


@pytest.mark.parametrize("change,message", [
    (lambda w: w["workload"]["classes"][0].update(name="default"),
     r"workload\.classes\[0\]\.name: repeats the name of workload\.class_name.*\(got 'default'\)"),
    (lambda w: w["workload"]["classes"].append(dict(BATCH)),
     r"workload\.classes\[1\]\.name: repeats the name of workload\.classes\[0\].*\(got 'batch'\)"),
    (lambda w: w["workload"]["classes"][0].update(name="batch jobs"),
     r"workload\.classes\[0\]\.name: must be a simple identifier.*\(got 'batch jobs'\)"),
    (lambda w: w["workload"].update(class_name="chat.v2"),
     r"workload\.class_name: must be a simple identifier.*\(got 'chat\.v2'\)"),
    (lambda w: w["workload"]["classes"][0].pop("name"), r"workload\.classes\[0\]\.name: required key is missing"),
    (lambda w: w["workload"]["classes"][0].update(start_s=-1.0),
     r"workload\.classes\[0\]\.start_s: input should be greater than or equal to 0 \(got -1\.0\)"),
    (lambda w: w["workload"]["classes"][0].update(start_s="soon"), r"workload\.classes\[0\]\.start_s: .*\(got 'soon'\)"),
    (lambda w: w["workload"]["classes"][0].update(phases=[{"num_requests": 1}]),
     r"workload\.classes\[0\]\.phases: a class has no phases"),
    (lambda w: w["workload"]["classes"][0].update(slo={"ttft": 100}),
     r"workload\.classes\[0\]\.slo\.ttft: unknown key; did you mean 'ttft_ms'\?"),
    (lambda w: w["workload"]["classes"][0].update(duration_s=10.0),
     r"workload\.classes\[0\]\.duration_s: set either num_requests or duration_s, not both"),
    (lambda w: w["workload"].update(classes=[]), r"workload\.classes: list should have at least 1 item"),
])
def test_schema_errors_name_the_field_and_the_value(raw_workload, change, message):
    raw = with_classes(raw_workload, BATCH)
    change(raw)
    with pytest.raises(WorkloadError, match=message):
        load_workload(raw)


def test_a_class_is_checked_against_the_engine_and_named_in_the_error(raw_workload):
    raw = with_classes(raw_workload, dict(BATCH, shared_prefix={"num_groups": 1, "prefix_len": 600}))
    raw["engine"]["max_model_len"] = 512
    with pytest.raises(WorkloadError, match=r"workload\.classes\[0\]\.shared_prefix\.prefix_len"):
        load_workload(raw)


@pytest.mark.parametrize("path", ["workload.classes.0.arrival.rate", "workload.classes[0].arrival.rate"])
def test_overrides_and_sweeps_reach_into_a_class_by_position(raw_workload, path):
    raw = with_classes(raw_workload, BATCH)
    assert load_workload(raw, overrides=[f"{path}=4.0"]).workload.classes[0].arrival.rate == 4.0
    raw["sweep"] = {path: [1.0, 2.0]}
    points = load_workload(raw).sweep_points()
    assert [(label, point.workload.classes[0].arrival.rate) for label, point in points] == [("rate=1.0", 1.0),
                                                                                            ("rate=2.0", 2.0)]
    # The sweep varies the batch class only: the top-level class's requests are the same at each point.
    first, second = (by_class(generate_requests(point, VOCAB_SIZE)) for _, point in points)
    assert without_ids(first["default"]) == without_ids(second["default"])


def test_an_override_past_the_classes_or_misspelled_is_an_error(raw_workload):
    raw = with_classes(raw_workload, BATCH)
    with pytest.raises(WorkloadError, match=r"workload\.classes\.2: must be an index of the 1 entries"):
        load_workload(raw, overrides=["workload.classes[2].start_s=1"])
    with pytest.raises(WorkloadError, match=r"workload\.classes\.0\.start: no such setting; did you mean 'start_s'"):
        load_workload(raw, overrides=["workload.classes.0.start=1"])
    raw["sweep"] = {"workload.classes.0.start_s": [0.0, -1.0]}
    with pytest.raises(WorkloadError, match=r"sweep\.workload\.classes\.0\.start_s: value -1\.0 gives an invalid"):
        load_workload(raw)


def test_a_class_trace_path_resolves_against_the_yaml_directory(tmp_path, data_dir):
    import shutil

    import yaml

    shutil.copy(data_dir / "splitwise_conv_sample.csv", tmp_path / "conv.csv")
    raw = {"name": "t", "workload": {"num_requests": 5, "arrival": {"type": "poisson", "rate": 1},
                                     "prompt_len": {"type": "constant", "value": 10},
                                     "output_len": {"type": "constant", "value": 4},
                                     "classes": [{"name": "traced", "num_requests": 5, "trace": {"path": "conv.csv"},
                                                  "arrival": {"type": "trace"}, "prompt_len": {"type": "trace"},
                                                  "output_len": {"type": "trace"}}]}}
    (tmp_path / "w.yaml").write_text(yaml.safe_dump(raw))
    config = load_workload(tmp_path / "w.yaml")
    assert config.workload.classes[0].trace.path == str(tmp_path / "conv.csv")
    assert len(generate_requests(config, VOCAB_SIZE)) == 10
