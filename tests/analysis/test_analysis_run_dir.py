import json
import math

import numpy as np
import pyarrow.parquet as pq
import pytest

from analysis.metrics import compute_summary
from analysis.run_dir import Run, read_run, write_run, write_summary
from analysis.trace_schema import REQUESTS_SCHEMA, STEPS_SCHEMA, requests_table, steps_table


def test_round_trip_preserves_columns_and_dtypes(tmp_path, request_columns, step_columns):
    summary = {"name": "round-trip", "mode": "sim"}
    out_dir = write_run(tmp_path / "run", request_columns, step_columns, summary)
    assert {path.name for path in out_dir.iterdir()} == {"requests.parquet", "steps.parquet", "summary.json"}
    assert pq.read_schema(out_dir / "requests.parquet").equals(REQUESTS_SCHEMA)
    assert pq.read_schema(out_dir / "steps.parquet").equals(STEPS_SCHEMA)

    run = read_run(out_dir)
    assert isinstance(run, Run) and run.path == out_dir and run.name == "round-trip"
    expected_requests = requests_table(request_columns).to_pandas()
    expected_steps = steps_table(step_columns).to_pandas()
    assert run.requests.dtypes.to_dict() == expected_requests.dtypes.to_dict()
    assert run.steps.dtypes.to_dict() == expected_steps.dtypes.to_dict()
    assert run.requests["arrival_time"].dtype == np.float64
    assert run.requests["num_output_tokens"].dtype == np.int64
    assert run.steps.equals(expected_steps)
    assert list(run.requests["request_id"]) == ["r0", "r1", "r2", "r3"]
    assert [list(times) for times in run.requests["token_times"]] == request_columns["token_times"]
    assert np.isnan(run.requests["first_token_time"].iloc[3])
    assert run.summary == summary


def test_round_trip_of_a_read_run(tmp_path, request_columns, step_columns):
    first = read_run(write_run(tmp_path / "first", request_columns, step_columns, {"name": "a"}))
    second = read_run(write_run(tmp_path / "second", first.requests, first.steps, first.summary))
    assert second.requests.drop(columns="token_times").equals(first.requests.drop(columns="token_times"))
    assert [list(times) for times in second.requests["token_times"]] == request_columns["token_times"]


def test_summary_is_strict_json(tmp_path):
    summary = {
        "name": "numpy",
        "count": np.int64(3),
        "rate": np.float32(0.5),
        "missing": float("nan"),
        "infinite": np.inf,
        "flag": np.bool_(True),
        "values": np.array([1.0, np.nan]),
        "nested": {"p50": np.float64(1.25), "tuple": (1, 2)},
    }
    path = write_summary(tmp_path, summary)
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert text.startswith('{\n  "name"')  # indent 2
    loaded = json.loads(text)
    assert loaded == {
        "name": "numpy",
        "count": 3,
        "rate": 0.5,
        "missing": None,
        "infinite": None,
        "flag": True,
        "values": [1.0, None],
        "nested": {"p50": 1.25, "tuple": [1, 2]},
    }


def test_computed_summary_survives_the_round_trip(tmp_path, request_columns, step_columns):
    requests = requests_table(request_columns).to_pandas()
    steps = steps_table(step_columns).to_pandas()
    summary = compute_summary(requests, steps, name="hand", mode="real", config={"block_size": 16}, slo=None)
    run = read_run(write_run(tmp_path / "run", requests, steps, summary))
    assert run.summary == summary
    again = compute_summary(
        run.requests, run.steps, name="hand", mode="real", config={"block_size": 16}, slo=None
    )
    assert again == summary


@pytest.mark.parametrize("file_name", ["requests.parquet", "steps.parquet", "summary.json"])
def test_missing_file_is_named(tmp_path, request_columns, step_columns, file_name):
    out_dir = write_run(tmp_path / "run", request_columns, step_columns, {"name": "x"})
    (out_dir / file_name).unlink()
    with pytest.raises(FileNotFoundError, match=file_name.replace(".", r"\.")):
        read_run(out_dir)


def test_missing_directory_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        read_run(tmp_path / "nowhere")


def test_a_file_given_as_a_run_directory_is_called_so(tmp_path):
    (tmp_path / "chat.yaml").write_text("name: chat\n")
    with pytest.raises(FileNotFoundError, match="'.*chat.yaml' is not a directory; expected a run directory"):
        read_run(tmp_path / "chat.yaml")


def test_bad_trace_writes_nothing(tmp_path, request_columns, step_columns):
    del step_columns["duration"]
    with pytest.raises(ValueError, match="duration"):
        write_run(tmp_path / "run", request_columns, step_columns, {})
    assert not (tmp_path / "run").exists()


def test_json_safe_handles_infinite_and_nan_in_config(tmp_path):
    write_summary(tmp_path, {"config": {"max_model_len": math.inf}})
    assert json.loads((tmp_path / "summary.json").read_text()) == {"config": {"max_model_len": None}}


@pytest.mark.parametrize("text, kind", [("[1, 2]", "list"), ("3", "int")])
def test_a_summary_that_is_not_an_object_is_named(tmp_path, request_columns, step_columns, text, kind):
    write_run(tmp_path / "run", request_columns, step_columns, {})
    (tmp_path / "run" / "summary.json").write_text(text)
    with pytest.raises(ValueError, match=rf"summary.json must hold a JSON object \(the run's summary\), got {kind}"):
        read_run(tmp_path / "run")


def test_a_run_without_a_recorded_config_cannot_be_replayed(tmp_path, request_columns, step_columns):
    from sim.replay import replay_inputs

    write_run(tmp_path / "run", request_columns, step_columns, {})
    with pytest.raises(ValueError, match="summary.json has no 'config' object; only real runs"):
        replay_inputs(read_run(tmp_path / "run"))
