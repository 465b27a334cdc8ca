import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from analysis.trace_schema import (
    REQUESTS_SCHEMA,
    REQUIRED_REQUEST_COLUMNS,
    REQUIRED_STEP_COLUMNS,
    STEPS_SCHEMA,
    check_requests_frame,
    check_steps_frame,
    requests_table,
    steps_table,
)


def test_tables_follow_the_schemas(request_columns, step_columns):
    requests = requests_table(request_columns)
    steps = steps_table(step_columns)
    assert requests.schema.equals(REQUESTS_SCHEMA)
    assert steps.schema.equals(STEPS_SCHEMA)
    assert requests.num_rows == 4 and steps.num_rows == 3
    assert requests.column("token_times").to_pylist()[1] == [1.4, 1.6, 1.8, 2.0]


def test_design_columns_are_a_subset_of_the_schemas():
    assert set(REQUIRED_REQUEST_COLUMNS) <= set(REQUESTS_SCHEMA.names)
    assert set(REQUIRED_STEP_COLUMNS) <= set(STEPS_SCHEMA.names)


def test_optional_columns_get_neutral_defaults(request_columns, step_columns):
    for optional in ("scheduled_time", "priority"):
        del request_columns[optional]
    for optional in ("kv_usage", "prefix_query_tokens", "prefill_attention_work", "decode_context_tokens"):
        del step_columns[optional]
    requests = requests_table(request_columns).to_pandas()
    steps = steps_table(step_columns).to_pandas()
    assert requests["scheduled_time"].isna().all()
    assert (requests["priority"] == 0).all()
    assert steps["kv_usage"].isna().all() and steps["prefill_attention_work"].isna().all()
    assert (steps["prefix_query_tokens"] == 0).all() and steps["decode_context_tokens"].dtype == np.int64


def test_none_times_become_nan_and_none_token_times_become_empty(request_columns):
    request_columns["first_token_time"][3] = None
    request_columns["token_times"][3] = None
    frame = requests_table(request_columns).to_pandas()
    assert np.isnan(frame["first_token_time"].iloc[3])
    assert len(frame["token_times"].iloc[3]) == 0


def test_integer_request_ids_are_stored_as_text(request_columns):
    request_columns["request_id"] = [10, 11, 12, 13]
    assert requests_table(request_columns).column("request_id").to_pylist() == ["10", "11", "12", "13"]


def test_extra_columns_are_kept(request_columns):
    request_columns["tenant"] = ["a", "b", "a", "c"]
    table = requests_table(request_columns)
    assert table.column_names[-1] == "tenant"
    assert table.column("tenant").to_pylist() == ["a", "b", "a", "c"]


def test_numpy_token_times_match_list_token_times(request_columns):
    from_lists = requests_table(request_columns)
    request_columns["token_times"] = [np.asarray(row) for row in request_columns["token_times"]]
    from_arrays = requests_table(request_columns)
    assert from_arrays.column("token_times").equals(from_lists.column("token_times"))


def test_dataframe_and_table_inputs_rebuild_the_same_table(request_columns):
    table = requests_table(request_columns)
    rebuilt_from_frame = requests_table(table.to_pandas())
    rebuilt_from_table = requests_table(table)
    assert rebuilt_from_frame.schema.equals(table.schema)
    assert rebuilt_from_frame.column("token_times").equals(table.column("token_times"))
    assert rebuilt_from_table.column("finish_reason").equals(table.column("finish_reason"))


def test_empty_columns_build_empty_tables():
    requests = requests_table({name: [] for name in REQUIRED_REQUEST_COLUMNS})
    steps = steps_table({name: [] for name in REQUIRED_STEP_COLUMNS})
    assert requests.num_rows == 0 and requests.schema.equals(REQUESTS_SCHEMA)
    assert steps.num_rows == 0 and steps.schema.equals(STEPS_SCHEMA)


def test_missing_required_column_is_named(request_columns, step_columns):
    del request_columns["finish_time"]
    with pytest.raises(ValueError, match="finish_time"):
        requests_table(request_columns)
    del step_columns["kv_blocks_used"]
    with pytest.raises(ValueError, match="kv_blocks_used"):
        steps_table(step_columns)


def test_check_frames_name_the_missing_column(request_columns, step_columns):
    requests = requests_table(request_columns).to_pandas()
    steps = steps_table(step_columns).to_pandas()
    check_requests_frame(requests)
    check_steps_frame(steps)
    with pytest.raises(ValueError, match="'token_times'"):
        check_requests_frame(requests.drop(columns=["token_times"]))
    with pytest.raises(ValueError, match="'prefix_hit_tokens'"):
        check_steps_frame(steps.drop(columns=["prefix_hit_tokens"]))


def test_length_mismatch_names_the_column(request_columns):
    request_columns["num_cached_tokens"] = [0, 0]
    with pytest.raises(ValueError, match="num_cached_tokens"):
        requests_table(request_columns)


def test_bad_values_name_the_column(step_columns):
    step_columns["num_running"] = [1, None, 2]
    with pytest.raises(ValueError, match="num_running"):
        steps_table(step_columns)


def test_pyarrow_and_pandas_arrow_inputs(request_columns):
    table = requests_table(request_columns)
    arrow_frame = table.to_pandas(types_mapper=pd.ArrowDtype)
    rebuilt = requests_table(arrow_frame)
    assert rebuilt.schema.equals(REQUESTS_SCHEMA)
    assert rebuilt.column("token_times").equals(table.column("token_times"))
    assert isinstance(rebuilt.column("arrival_time").type, pa.DataType)
