"""The trace schema: the columns of `requests.parquet` and `steps.parquet`.

Both executors (real runner and simulator) write these two tables, so every downstream tool
(metrics, dashboards, calibration, fidelity reports) reads one schema. The schemas here are explicit
so that a column keeps its type from one run to the next: a run where every request happened to have
an integer arrival time must still store `arrival_time` as float64, and an empty run must still have
every column.

Times are seconds from the start of the run. A time that never happened (a request never scheduled,
a request aborted before its first token) is NaN, not a sentinel number, so that arithmetic on it
propagates "unknown" instead of producing a plausible-looking wrong latency.

Producers hand column-oriented dicts (column name -> list or numpy array) to `requests_table` /
`steps_table`. The required columns (those DESIGN.md names) must be present; the extra columns of the
schema are filled with a neutral default when absent (NaN for times and floats, 0 for counts, an empty
list for `token_times`). Columns not in the schema are kept, with their inferred type, after the
schema's columns: more columns are welcome.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

# Finish reasons as the engine reports them (engine.core.request.FINISH_REASONS). Only "stop" and
# "length" are completed requests; the others are counted apart from latency metrics.
COMPLETED_FINISH_REASONS = ("stop", "length")
FINISH_REASONS = ("stop", "length", "abort", "ignored", "error")

TOKEN_TIMES_TYPE = pa.list_(pa.float64())

# The class of every request of a workload without classes: workloads.request_spec.DEFAULT_REQUEST_CLASS,
# spelled again here because analysis imports nothing from workloads (a test holds the two equal).
DEFAULT_REQUEST_CLASS = "default"
REQUEST_CLASS_COLUMN = "request_class"

REQUESTS_SCHEMA = pa.schema(
    [
        pa.field("request_id", pa.string(), nullable=False),
        pa.field("arrival_time", pa.float64()),
        # First time the scheduler gave the request tokens to compute; NaN if it never ran.
        pa.field("scheduled_time", pa.float64()),
        pa.field("first_token_time", pa.float64()),
        pa.field("finish_time", pa.float64()),
        pa.field("num_prompt_tokens", pa.int64()),
        pa.field("num_output_tokens", pa.int64()),
        # Prompt tokens served from the prefix cache when the request was first scheduled.
        pa.field("num_cached_tokens", pa.int64()),
        pa.field("num_preemptions", pa.int64()),
        # One of FINISH_REASONS; null for a request still unfinished when the run stopped.
        pa.field("finish_reason", pa.string()),
        # Why the engine ended the request, where it says: an ignored request's reason (its prompt does not
        # fit the model or the KV cache), an errored one's (a server's error message); null otherwise.
        pa.field("status_message", pa.string()),
        pa.field("priority", pa.int64()),
        # The workload class the request was drawn from (workload.class_name, workload.classes[i].name);
        # a trace written before classes existed reads as DEFAULT_REQUEST_CLASS.
        pa.field("request_class", pa.string()),
        # Time of each output token, in order; token_times[0] == first_token_time.
        pa.field("token_times", TOKEN_TIMES_TYPE),
    ]
)

STEPS_SCHEMA = pa.schema(
    [
        pa.field("step", pa.int64(), nullable=False),
        pa.field("start_time", pa.float64()),
        pa.field("duration", pa.float64()),
        pa.field("num_prefill_reqs", pa.int64()),
        pa.field("num_decode_reqs", pa.int64()),
        pa.field("num_scheduled_tokens", pa.int64()),
        pa.field("num_prefill_tokens", pa.int64()),
        # Sum over scheduled requests of their context length (computed + scheduled tokens).
        pa.field("num_context_tokens", pa.int64()),
        pa.field("num_running", pa.int64()),
        pa.field("num_waiting", pa.int64()),
        pa.field("kv_blocks_used", pa.int64()),
        # kv_blocks_used / usable blocks, in [0, 1].
        pa.field("kv_usage", pa.float64()),
        pa.field("num_preemptions", pa.int64()),
        # Prompt tokens found in the prefix cache / looked up, by requests first scheduled this step.
        pa.field("prefix_hit_tokens", pa.int64()),
        pa.field("prefix_query_tokens", pa.int64()),
        # Calibration features for step-time models: attention work of the prefill chunks (sum over
        # prefill requests of new tokens x context length) and context tokens read by decodes.
        pa.field("prefill_attention_work", pa.float64()),
        pa.field("decode_context_tokens", pa.int64()),
    ]
)

# The columns DESIGN.md promises; a trace without one of these is rejected.
REQUIRED_REQUEST_COLUMNS = (
    "request_id",
    "arrival_time",
    "first_token_time",
    "finish_time",
    "num_prompt_tokens",
    "num_output_tokens",
    "num_cached_tokens",
    "num_preemptions",
    "finish_reason",
    "token_times",
)
REQUIRED_STEP_COLUMNS = (
    "step",
    "start_time",
    "duration",
    "num_prefill_reqs",
    "num_decode_reqs",
    "num_scheduled_tokens",
    "num_prefill_tokens",
    "num_context_tokens",
    "num_running",
    "num_waiting",
    "kv_blocks_used",
    "num_preemptions",
    "prefix_hit_tokens",
)


def requests_table(records: Mapping[str, Any] | pd.DataFrame | pa.Table) -> pa.Table:
    """Build the requests table from columns (name -> list / numpy array / pyarrow array)."""
    return _build_table(records, REQUESTS_SCHEMA, REQUIRED_REQUEST_COLUMNS, "requests")


def steps_table(records: Mapping[str, Any] | pd.DataFrame | pa.Table) -> pa.Table:
    """Build the steps table from columns (name -> list / numpy array / pyarrow array)."""
    return _build_table(records, STEPS_SCHEMA, REQUIRED_STEP_COLUMNS, "steps")


def check_requests_frame(frame: pd.DataFrame) -> None:
    """Raise ValueError naming the first required requests column that `frame` lacks."""
    _check_columns(frame, REQUIRED_REQUEST_COLUMNS, "requests")


def check_steps_frame(frame: pd.DataFrame) -> None:
    """Raise ValueError naming the first required steps column that `frame` lacks."""
    _check_columns(frame, REQUIRED_STEP_COLUMNS, "steps")


def request_classes(requests: pd.DataFrame) -> np.ndarray:
    """Each row's request class as an array of str; DEFAULT_REQUEST_CLASS where the trace has no such column
    (a run recorded before classes) or the row none."""
    if REQUEST_CLASS_COLUMN not in requests.columns:
        return np.full(len(requests), DEFAULT_REQUEST_CLASS, dtype=object)
    return requests[REQUEST_CLASS_COLUMN].fillna(DEFAULT_REQUEST_CLASS).astype(str).to_numpy(dtype=object)


def with_request_class(requests: pd.DataFrame) -> pd.DataFrame:
    """``requests`` with a request_class column: a trace without one (recorded before classes) reads as
    one class, DEFAULT_REQUEST_CLASS. The frame is changed in place and returned."""
    if REQUEST_CLASS_COLUMN not in requests.columns:
        requests[REQUEST_CLASS_COLUMN] = request_classes(requests)
    return requests


def empty_requests_frame() -> pd.DataFrame:
    return requests_table({name: [] for name in REQUIRED_REQUEST_COLUMNS}).to_pandas()


def empty_steps_frame() -> pd.DataFrame:
    return steps_table({name: [] for name in REQUIRED_STEP_COLUMNS}).to_pandas()


def _check_columns(frame: pd.DataFrame, required: Sequence[str], table_name: str) -> None:
    present = set(frame.columns)
    for name in required:
        if name not in present:
            raise ValueError(
                f"{table_name} trace is missing required column {name!r} "
                f"(has: {', '.join(map(str, frame.columns)) or 'no columns'})"
            )


def _build_table(
    records: Mapping[str, Any] | pd.DataFrame | pa.Table,
    schema: pa.Schema,
    required: Sequence[str],
    table_name: str,
) -> pa.Table:
    if isinstance(records, pa.Table):
        records = {name: records.column(name) for name in records.column_names}
    elif isinstance(records, pd.DataFrame):
        records = {name: records[name] for name in records.columns}
    for name in required:
        if name not in records:
            raise ValueError(f"{table_name} columns are missing required column {name!r}")

    num_rows = _common_length(records, table_name)
    arrays: list[pa.Array] = []
    fields: list[pa.Field] = []
    for field in schema:
        if field.name in records:
            array = _to_arrow(records[field.name], field, table_name)
        else:
            array = _default_column(field, num_rows)
        arrays.append(array)
        fields.append(field)
    # Extra columns survive with an inferred type: producers may add what they like.
    for name, values in records.items():
        if name in schema.names:
            continue
        try:
            array = _as_array(pa.array(_plain(values), from_pandas=True))  # NaN in a text column: null, as pandas reads it
        except (pa.ArrowException, TypeError, ValueError) as error:
            raise ValueError(f"{table_name} column {name!r}: cannot store values ({error})") from error
        arrays.append(array)
        fields.append(pa.field(str(name), array.type))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def _common_length(records: Mapping[str, Any], table_name: str) -> int:
    lengths = {name: len(values) for name, values in records.items()}
    if not lengths:
        return 0
    first_name, first_length = next(iter(lengths.items()))
    for name, length in lengths.items():
        if length != first_length:
            raise ValueError(
                f"{table_name} column {name!r} has {length} rows but {first_name!r} has {first_length}"
            )
    return first_length


def _default_column(field: pa.Field, num_rows: int) -> pa.Array:
    if field.name == REQUEST_CLASS_COLUMN:
        # A producer that knows no classes ran one: the default.
        return pa.array([DEFAULT_REQUEST_CLASS] * num_rows, type=field.type)
    if field.type == TOKEN_TIMES_TYPE:
        offsets = pa.array(np.zeros(num_rows + 1, dtype=np.int32))
        return pa.ListArray.from_arrays(offsets, pa.array([], type=pa.float64()))
    if pa.types.is_floating(field.type):
        return pa.array(np.full(num_rows, np.nan))
    if pa.types.is_integer(field.type):
        return pa.array(np.zeros(num_rows, dtype=np.int64))
    return pa.nulls(num_rows, type=field.type)


def _to_arrow(values: Any, field: pa.Field, table_name: str) -> pa.Array:
    try:
        if field.type == TOKEN_TIMES_TYPE:
            return _token_times_array(values)
        if pa.types.is_floating(field.type):
            # None in a time column means "never happened": store NaN, the schema's convention.
            return pa.array(_float_column(values))
        if pa.types.is_integer(field.type):
            return pa.array(np.asarray(_plain(values), dtype=np.int64))
        values = _plain(values)
        if field.name == "request_id":
            # Workloads may number their requests; the trace stores ids as text either way.
            values = [value if value is None or isinstance(value, str) else str(value) for value in values]
        return _as_array(pa.array(values, type=field.type, from_pandas=True))
    except (pa.ArrowException, TypeError, ValueError) as error:
        raise ValueError(
            f"{table_name} column {field.name!r}: cannot store values as {field.type} ({error})"
        ) from error


def _float_column(values: Any) -> np.ndarray:
    values = _plain(values)
    if isinstance(values, np.ndarray) and values.dtype.kind in "fiub":
        return values.astype(np.float64, copy=False)
    if isinstance(values, pa.Array):
        return values.cast(pa.float64()).fill_null(np.nan).to_numpy(zero_copy_only=False)
    # numpy turns None into NaN when the target dtype is float.
    return np.asarray(values, dtype=np.float64)


def _token_times_array(values: Any) -> pa.Array:
    """Build list<float64> from per-request sequences.

    The fast path (every row a numpy array, as a simulator or `read_run` produces) concatenates the
    rows once and builds the list array from offsets; anything else goes through pyarrow's converter.
    """
    values = _plain(values)
    if isinstance(values, pa.Array):
        return values.cast(TOKEN_TIMES_TYPE)
    rows = list(values)
    if all(isinstance(row, np.ndarray) for row in rows):
        lengths = np.fromiter((row.size for row in rows), dtype=np.int64, count=len(rows))
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if offsets[-1] > np.iinfo(np.int32).max:
            raise ValueError("too many token times for a 32-bit-offset list column")
        flat = np.concatenate(rows).astype(np.float64, copy=False) if rows else np.empty(0)
        return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(flat))
    # A missing row means "no tokens": store an empty list so readers never meet nulls.
    rows = [() if row is None else row for row in rows]
    return pa.array(rows, type=TOKEN_TIMES_TYPE)


def _plain(values: Any) -> Any:
    """Unwrap pandas and chunked-arrow containers to numpy arrays / pyarrow arrays / sequences."""
    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks()
    if isinstance(values, (pd.Series, pd.Index)):
        if isinstance(values.dtype, pd.ArrowDtype):
            return pa.array(values)
        if values.dtype == object or isinstance(values.dtype, pd.StringDtype):
            return values.tolist() if values.dtype != object else list(values.to_numpy())
        return values.to_numpy()
    return values


def _as_array(array: pa.Array | pa.ChunkedArray) -> pa.Array:
    return array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array
