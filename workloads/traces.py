"""Reading request traces into arrays: Splitwise/Vidur CSV and Mooncake JSONL.

Two public formats carry real traffic:

- ``csv``: the Azure LLM inference trace 2023 as processed by Splitwise and Vidur, columns
  ``arrived_at`` (seconds), ``num_prefill_tokens``, ``num_decode_tokens``; other columns are ignored.
  An optional ``lora_adapter`` column names each request's LoRA adapter by its index (``adapter-i``), empty for
  the base model (``workload.lora.popularity: trace`` takes it).
- ``mooncake``: Mooncake's (Kimi, FAST'25) JSONL, one object per line with ``timestamp``
  (milliseconds), ``input_length``, ``output_length`` and ``hash_ids``. Each hash id names one
  512-token block of the prompt; equal ids mean equal content, which is how the trace carries its
  prefix sharing. The generator turns each id into a fixed block of token ids (tokens.py). An optional
  ``lora_adapter`` key (an adapter index, or null) is the CSV column's equivalent.

Reads are cached by (path, size, modification time): a sweep validates and generates every point from
the same file. The cached arrays are read-only so no caller can change another's view of the trace.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

TraceFormat = Literal["csv", "mooncake"]

# Mooncake's hash ids each stand for this many prompt tokens (the trace's own block size).
MOONCAKE_BLOCK_SIZE = 512
# No request holds more tokens than this; a larger count is bad data (and past 2**63 it would not even fit
# the int64 arrays the trace is held in).
MAX_TRACE_TOKENS = 2**31 - 1
# Mooncake hash ids are 64-bit hashes' worth of integers at most.
MAX_HASH_ID = 2**63 - 1
CSV_COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
# The optional column (CSV) or key (JSONL) naming each request's LoRA adapter by index; BASE_MODEL where empty.
LORA_ADAPTER_COLUMN = "lora_adapter"
BASE_MODEL = -1


class TraceFormatError(ValueError):
    """A trace file that cannot be read; the message names the file and the line."""


@dataclass(frozen=True, eq=False)
class TraceRecords:
    """One trace as columns; row i is one request in file order.

    ``block_hash_ids`` / ``block_hash_offsets`` hold the Mooncake hash ids in CSR form: row i's ids are
    ``block_hash_ids[block_hash_offsets[i]:block_hash_offsets[i + 1]]``. Both are None for CSV traces.
    """

    source: str
    arrival_times: np.ndarray  # seconds, as in the file (not shifted to 0)
    prompt_lens: np.ndarray
    output_lens: np.ndarray
    block_hash_ids: np.ndarray | None = None
    block_hash_offsets: np.ndarray | None = None
    block_size: int = MOONCAKE_BLOCK_SIZE
    # Each row's LoRA adapter index (BASE_MODEL: none), when the trace has the lora_adapter column; else None.
    lora_adapters: np.ndarray | None = None

    @property
    def num_rows(self) -> int:
        return len(self.arrival_times)

    @property
    def has_block_hashes(self) -> bool:
        return self.block_hash_ids is not None

    def hash_ids_of(self, row: int) -> np.ndarray:
        assert self.block_hash_ids is not None and self.block_hash_offsets is not None
        return self.block_hash_ids[self.block_hash_offsets[row] : self.block_hash_offsets[row + 1]]


def infer_format(path: str | os.PathLike[str]) -> TraceFormat:
    suffix = Path(path).suffix.lower()
    if suffix == ".csv":
        return "csv"
    if suffix in (".jsonl", ".json"):
        return "mooncake"
    raise TraceFormatError(
        f"{path}: cannot tell the trace format from the suffix {suffix!r}; set format: csv or mooncake"
    )


def read_trace(path: str | os.PathLike[str], trace_format: TraceFormat | None = None) -> TraceRecords:
    """Read a trace (format inferred from the suffix when not given); cached while the file is unchanged."""
    resolved = Path(path).expanduser().resolve()
    try:
        status = resolved.stat()
    except OSError as error:
        raise TraceFormatError(f"{path}: cannot read the trace ({error.strerror or error})") from error
    return _read_cached(str(resolved), trace_format or infer_format(resolved), status.st_size, status.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _read_cached(path: str, trace_format: TraceFormat, size: int, mtime_ns: int) -> TraceRecords:
    del size, mtime_ns  # part of the cache key only: a changed file is read again
    records = read_splitwise_csv(path) if trace_format == "csv" else read_mooncake_jsonl(path)
    for array in (
        records.arrival_times,
        records.prompt_lens,
        records.output_lens,
        records.block_hash_ids,
        records.block_hash_offsets,
        records.lora_adapters,
    ):
        if array is not None:
            array.setflags(write=False)
    return records


def _integer(text: str, where: str, name: str, minimum: int) -> int:
    try:
        number = float(text)
    except ValueError:
        number = float("nan")
    if not number.is_integer():
        raise TraceFormatError(f"{where}: {name} must be an integer (got {text!r})")
    value = int(number)
    if value < minimum:
        raise TraceFormatError(f"{where}: {name} must be >= {minimum} (got {value})")
    if value > MAX_TRACE_TOKENS:
        raise TraceFormatError(f"{where}: {name} must be <= {MAX_TRACE_TOKENS} (got {text!r})")
    return value


def _seconds(text: str, where: str, name: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise TraceFormatError(f"{where}: {name} must be a number (got {text!r})") from None
    if not np.isfinite(value) or value < 0:
        raise TraceFormatError(f"{where}: {name} must be a finite number >= 0 (got {text!r})")
    return value


def _open_text(path: str | os.PathLike[str]) -> io.StringIO:
    """A trace file's text, read as UTF-8 with a byte-order mark skipped (spreadsheet exports write one); a
    file that is not UTF-8 is a TraceFormatError naming it, not a bare UnicodeDecodeError."""
    try:
        text = Path(path).read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise TraceFormatError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    return io.StringIO(text, newline="")


def read_splitwise_csv(path: str | os.PathLike[str]) -> TraceRecords:
    times: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    adapters: list[int] = []
    with _open_text(path) as handle:
        reader = csv.reader(handle)
        header = [column.strip() for column in next(reader, [])]
        missing = [column for column in CSV_COLUMNS if column not in header]
        if missing:
            raise TraceFormatError(f"{path} line 1: missing column(s) {', '.join(missing)} (header is {header})")
        time_column, prompt_column, output_column = (header.index(column) for column in CSV_COLUMNS)
        adapter_column = header.index(LORA_ADAPTER_COLUMN) if LORA_ADAPTER_COLUMN in header else None
        for line_number, row in enumerate(reader, start=2):
            if not row or all(not cell.strip() for cell in row):
                continue
            where = f"{path} line {line_number}"
            if len(row) < len(header):
                raise TraceFormatError(f"{where}: expected {len(header)} columns, got {len(row)}")
            times.append(_seconds(row[time_column].strip(), where, "arrived_at"))
            prompts.append(_integer(row[prompt_column].strip(), where, "num_prefill_tokens", 1))
            outputs.append(_integer(row[output_column].strip(), where, "num_decode_tokens", 0))
            if adapter_column is not None:
                cell = row[adapter_column].strip()
                adapters.append(_integer(cell, where, LORA_ADAPTER_COLUMN, 0) if cell else BASE_MODEL)
    if not times:
        raise TraceFormatError(f"{path}: the trace has no rows")
    return TraceRecords(
        str(path), np.array(times), np.array(prompts, dtype=np.int64), np.array(outputs, dtype=np.int64),
        lora_adapters=np.array(adapters, dtype=np.int64) if adapter_column is not None else None,
    )


def read_mooncake_jsonl(path: str | os.PathLike[str]) -> TraceRecords:
    times: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    hash_ids: list[int] = []
    offsets = [0]
    adapters: list[int] = []
    with _open_text(path) as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path} line {line_number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise TraceFormatError(f"{where}: not valid JSON ({error.msg})") from None
            if not isinstance(record, dict):
                raise TraceFormatError(f"{where}: expected a JSON object, got {type(record).__name__}")
            for key in ("timestamp", "input_length", "output_length"):
                if key not in record:
                    raise TraceFormatError(f"{where}: missing key {key!r}")
            times.append(_seconds(str(record["timestamp"]), where, "timestamp") / 1000.0)
            prompts.append(_integer(str(record["input_length"]), where, "input_length", 1))
            outputs.append(_integer(str(record["output_length"]), where, "output_length", 0))
            ids = record.get("hash_ids", [])
            if not isinstance(ids, list) or not all(isinstance(block, int) and not isinstance(block, bool)
                                                    and 0 <= block <= MAX_HASH_ID for block in ids):
                raise TraceFormatError(f"{where}: hash_ids must be a list of integers in [0, {MAX_HASH_ID}]")
            # One id per 512-token block of the prompt, the last block partial: a list of another length
            # would share (or leave unshared) blocks the trace never meant to.
            expected = -(-prompts[-1] // MOONCAKE_BLOCK_SIZE)
            if ids and len(ids) != expected:
                raise TraceFormatError(f"{where}: hash_ids has {len(ids)} ids, but input_length {prompts[-1]} "
                                       f"covers {expected} blocks of {MOONCAKE_BLOCK_SIZE} tokens")
            hash_ids.extend(ids)
            offsets.append(len(hash_ids))
            adapter = record.get(LORA_ADAPTER_COLUMN)
            adapters.append(BASE_MODEL if adapter is None else _integer(str(adapter), where, LORA_ADAPTER_COLUMN, 0))
    if not times:
        raise TraceFormatError(f"{path}: the trace has no rows")
    return TraceRecords(
        str(path),
        np.array(times),
        np.array(prompts, dtype=np.int64),
        np.array(outputs, dtype=np.int64),
        block_hash_ids=np.array(hash_ids, dtype=np.int64),
        block_hash_offsets=np.array(offsets, dtype=np.int64),
        # Only when some record names one: a trace without the key is the base model's, as before.
        lora_adapters=np.array(adapters, dtype=np.int64) if any(a != BASE_MODEL for a in adapters) else None,
    )
