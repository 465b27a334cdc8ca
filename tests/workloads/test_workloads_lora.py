"""workload.lora: which adapter each request runs with, drawn from its own stream, and its errors."""

from __future__ import annotations

import collections

import pytest

from workloads import WorkloadError, generate_requests, load_workload

VOCAB_SIZE = 1000
LORA = {"adapters": 8, "rank": 16, "popularity": {"zipf": 1.1}, "base_model_fraction": 0.25}


def with_lora(raw, lora=None, **engine):
    raw["engine"].update({"max_loras": 4, **engine})
    raw["workload"]["lora"] = dict(LORA if lora is None else lora)
    return raw


def problems(raw) -> str:
    with pytest.raises(WorkloadError) as error:
        load_workload(raw)
    return str(error.value)


def without_lora(requests):
    return [(r.request_id, r.arrival_time, r.prompt_token_ids, r.output_len, r.priority, r.prefix_group,
             r.request_class) for r in requests]


def test_adding_lora_leaves_every_other_attribute_unchanged(raw_workload):
    raw_workload["workload"]["shared_prefix"] = {"num_groups": 3, "prefix_len": 4, "fraction": 0.5}
    raw_workload["workload"]["priority"] = {"levels": [0, 1]}
    plain = generate_requests(load_workload(raw_workload), VOCAB_SIZE)
    adapted = generate_requests(load_workload(with_lora(raw_workload)), VOCAB_SIZE)
    assert without_lora(adapted) == without_lora(plain)
    assert {r.lora_name for r in plain} == {None} and {r.lora_int_id for r in plain} == {0}
    names = {r.lora_name for r in adapted}
    assert None in names and len(names) > 4


def test_adapters_are_named_with_runner_ids_and_follow_their_popularity(raw_workload):
    raw_workload["workload"]["num_requests"] = 4000
    requests = generate_requests(load_workload(with_lora(raw_workload)), VOCAB_SIZE)
    for request in requests:
        if request.lora_name is not None:
            assert request.lora_name == f"adapter-{request.lora_int_id - 1}"
    counts = collections.Counter(r.lora_name for r in requests)
    assert counts[None] / len(requests) == pytest.approx(0.25, abs=0.03)
    # Zipf 1.1 over 8 adapters: adapter-0 is twice as popular as adapter-1 (2 ** 1.1), and so on down.
    assert counts["adapter-0"] / counts["adapter-1"] == pytest.approx(2 ** 1.1, rel=0.15)
    assert counts["adapter-0"] > counts["adapter-3"] > counts["adapter-7"] > 0


def test_uniform_popularity_and_the_base_model_fraction_bounds(raw_workload):
    raw_workload["workload"]["num_requests"] = 4000
    lora = dict(LORA, popularity="uniform", base_model_fraction=0.0)
    counts = collections.Counter(r.lora_name for r in generate_requests(load_workload(with_lora(raw_workload, lora)),
                                                                         VOCAB_SIZE))
    assert None not in counts and len(counts) == 8 and min(counts.values()) > 400
    everything_base = dict(LORA, base_model_fraction=1.0)
    assert {r.lora_name for r in generate_requests(load_workload(with_lora(raw_workload, everything_base)),
                                                   VOCAB_SIZE)} == {None}


def test_a_picks_does_not_depend_on_the_number_of_requests(raw_workload):
    many = generate_requests(load_workload(with_lora(raw_workload)), VOCAB_SIZE)
    raw_workload["workload"]["num_requests"] = 50
    few = generate_requests(load_workload(raw_workload), VOCAB_SIZE)
    assert [r.lora_name for r in few] == [r.lora_name for r in many[:50]]


def test_completions_of_a_prompt_share_its_adapter(raw_workload):
    raw_workload["workload"]["n"] = 3
    requests = generate_requests(load_workload(with_lora(raw_workload)), VOCAB_SIZE)
    by_prompt = collections.defaultdict(set)
    for request in requests:
        by_prompt[request.request_id.split("_", 1)[1]].add(request.lora_name)
    assert all(len(names) == 1 for names in by_prompt.values())


def test_classes_and_phases_have_lora_sections_of_their_own(raw_workload):
    with_lora(raw_workload)
    stretch = {key: raw_workload["workload"][key] for key in ("num_requests", "arrival", "prompt_len", "output_len")}
    raw_workload["workload"]["phases"] = [dict(stretch, lora=dict(LORA, adapters=2, base_model_fraction=0.0))]
    raw_workload["workload"]["classes"] = [dict(stretch, name="batch")]  # no lora: the base model
    requests = generate_requests(load_workload(raw_workload), VOCAB_SIZE)
    batch = [r for r in requests if r.request_class == "batch"]
    assert batch and {r.lora_name for r in batch} == {None}
    last_phase = sorted((r for r in requests if r.request_class == "default"), key=lambda r: r.arrival_time)[-200:]
    assert {r.lora_name for r in last_phase} == {"adapter-0", "adapter-1"}
    config = load_workload(raw_workload)
    assert sorted(config.lora_adapters()) == [f"adapter-{i}" for i in range(8)]


def test_ranks_cycle_over_the_adapters(raw_workload):
    config = load_workload(with_lora(raw_workload, dict(LORA, rank=[8, 16, 64]), max_lora_rank=64))
    assert [spec.rank for spec in config.lora_adapters().values()] == [8, 16, 64, 8, 16, 64, 8, 16]


@pytest.mark.parametrize("where, value, expected", [
    ("lora.adapters", 0, "workload.lora.adapters"),
    ("lora.rank", 0, "workload.lora.rank: must be an integer in 1..512"),
    ("lora.rank", [8, "x"], "workload.lora.rank: every rank must be an integer in 1..512; not [1] 'x'"),
    ("lora.rank", [8, 8, 8, 8, 8, 8, 8, 8, 8], "workload.lora.rank: lists 9 ranks for 8 adapters"),
    ("lora.rank", 32, "workload.lora.rank: must be <= engine.max_lora_rank (16)"),
    ("lora.popularity", "zipf", "workload.lora.popularity: must be 'uniform', 'trace' or {zipf: s}"),
    ("lora.popularity", {"zipf": 0}, "workload.lora.popularity: must be 'uniform', 'trace' or {zipf: s}"),
    ("lora.popularity", {"pareto": 1}, "workload.lora.popularity"),
    ("lora.base_model_fraction", 1.5, "workload.lora.base_model_fraction"),
    ("lora.target_modules", ["qkv"], "workload.lora.target_modules: names unknown modules ['qkv']"),
    ("lora.target_modules", [], "workload.lora.target_modules"),
    ("lora.target_modules", ["q_proj", "q_proj"], "must not repeat a module"),
    ("lora.adapter", 3, "workload.lora.adapter: unknown key"),
])
def test_bad_lora_values_name_the_field_and_the_value(raw_workload, where, value, expected):
    with_lora(raw_workload)
    section, key = where.split(".")
    raw_workload["workload"][section][key] = value
    message = problems(raw_workload)
    assert expected in message and "(got" in message


@pytest.mark.parametrize("engine, expected", [
    ({"max_loras": 0}, "workload.lora: needs engine.max_loras > 0"),
    ({"max_loras": -1}, "engine.max_loras"),
    ({"max_lora_rank": 12}, "engine.max_lora_rank: must be one of vLLM's ranks"),
    ({"max_cpu_loras": 2}, "engine.max_cpu_loras: must be >= max_loras (4)"),
])
def test_bad_engine_lora_values_name_the_field(raw_workload, engine, expected):
    assert expected in problems(with_lora(raw_workload, **engine))


def test_one_adapter_has_one_shape_across_sections(raw_workload):
    with_lora(raw_workload)
    raw_workload["workload"]["classes"] = [dict(
        {key: raw_workload["workload"][key] for key in ("num_requests", "arrival", "prompt_len", "output_len")},
        name="batch", lora=dict(LORA, rank=8))]
    message = problems(raw_workload)
    assert "workload.classes[0].lora.rank: gives adapter-0 rank 8" in message and "workload.lora gives it rank 16" in message


def test_engine_lora_defaults_are_vllms(raw_workload):
    engine = load_workload(raw_workload).engine
    assert (engine.max_loras, engine.max_lora_rank, engine.max_cpu_loras) == (0, 16, None)
    assert load_workload(with_lora(raw_workload)).engine.cpu_lora_capacity() == 4


def trace_workload(raw, tmp_path, rows, lora=None, **stream):
    path = tmp_path / "trace.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens,lora_adapter\n"
                    + "".join(f"{i * 0.5},{10 + i},{5},{adapter}\n" for i, adapter in enumerate(rows)))
    raw["engine"]["max_loras"] = 2
    raw["workload"] = {"num_requests": len(rows), "arrival": {"type": "trace"}, "prompt_len": {"type": "trace"},
                       "output_len": {"type": "trace"}, "trace": {"path": str(path)},
                       "lora": lora or {"adapters": 4, "popularity": "trace"}, **stream}
    return raw


def test_a_trace_column_names_each_requests_adapter(raw_workload, tmp_path):
    rows = ["2", "", "0", "3", ""]
    requests = generate_requests(load_workload(trace_workload(raw_workload, tmp_path, rows)), VOCAB_SIZE)
    assert [r.lora_name for r in requests] == ["adapter-2", None, "adapter-0", "adapter-3", None]
    # Without popularity: trace the column is read but the section draws as always; without lora it is unused.
    raw = trace_workload(raw_workload, tmp_path, rows, lora={"adapters": 4})
    del raw["workload"]["lora"]
    assert {r.lora_name for r in generate_requests(load_workload(raw), VOCAB_SIZE)} == {None}


@pytest.mark.parametrize("lora, stream, expected", [
    ({"adapters": 3, "popularity": "trace"}, {}, "workload.lora.adapters: must be > every adapter index the trace "
                                                 "names (it names 3)"),
    ({"adapters": 4, "popularity": "trace", "base_model_fraction": 0.5}, {},
     "workload.lora.base_model_fraction: must be 0 with popularity: trace"),
    ({"adapters": 4, "popularity": "trace"}, {"arrival": {"type": "poisson", "rate": 1},
                                              "prompt_len": {"type": "constant", "value": 8},
                                              "output_len": {"type": "constant", "value": 8}},
     "workload.lora.popularity: is trace, but no request takes a trace row"),
])
def test_trace_adapters_refuse_what_cannot_work(raw_workload, tmp_path, lora, stream, expected):
    assert expected in problems(trace_workload(raw_workload, tmp_path, ["2", "", "0", "3", ""], lora, **stream))


def test_a_trace_without_the_column_cannot_name_adapters(raw_workload, data_dir):
    with_lora(raw_workload, dict(LORA, popularity="trace", base_model_fraction=0.0))
    assert "workload.lora.popularity: needs a workload.trace section" in problems(raw_workload)
    raw_workload["workload"]["trace"] = {"path": str(data_dir / "splitwise_conv_sample.csv")}
    raw_workload["workload"]["prompt_len"] = {"type": "trace"}
    assert "has no lora_adapter column" in problems(raw_workload)
