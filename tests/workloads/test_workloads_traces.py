"""Trace readers and trace-driven workloads: Splitwise CSV and Mooncake JSONL."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from workloads import TraceFormatError, WorkloadError, generate_requests, load_workload, read_trace
from workloads.traces import MOONCAKE_BLOCK_SIZE

VOCAB_SIZE = 32000


def csv_rows(path):
    with open(path, newline="") as handle:
        return [
            (float(row["arrived_at"]), int(row["num_prefill_tokens"]), int(row["num_decode_tokens"]))
            for row in csv.DictReader(handle)
        ]


def trace_workload(path, **workload):
    body = {
        "num_requests": 100,
        "arrival": {"type": "trace"},
        "prompt_len": {"type": "trace"},
        "output_len": {"type": "trace"},
        "trace": {"path": str(path)},
    }
    body.update(workload)
    return {"name": "trace", "seed": 3, "workload": body}


def test_csv_reader_reads_the_sample_exactly(data_dir):
    path = data_dir / "splitwise_conv_sample.csv"
    records = read_trace(path)
    expected = csv_rows(path)
    assert records.num_rows == len(expected) == 19366
    assert records.prompt_lens.tolist() == [row[1] for row in expected]
    assert records.output_lens.tolist() == [row[2] for row in expected]
    assert records.arrival_times.tolist() == [row[0] for row in expected]
    assert (records.prompt_lens[:2].tolist(), records.output_lens[:2].tolist()) == ([374, 396], [44, 109])
    assert not records.has_block_hashes
    with pytest.raises(ValueError):
        records.prompt_lens[0] = 1  # the cached arrays are read-only


def test_trace_replay_keeps_lengths_and_gaps(data_dir):
    path = data_dir / "splitwise_code_sample.csv"
    requests = generate_requests(load_workload(trace_workload(path)), VOCAB_SIZE)
    expected = csv_rows(path)[:100]
    assert [(r.num_prompt_tokens, r.output_len) for r in requests] == [(row[1], row[2]) for row in expected]
    np.testing.assert_allclose([r.arrival_time for r in requests], [row[0] - expected[0][0] for row in expected])


def test_time_scale_and_rate_rescale_the_gaps(data_dir):
    path = data_dir / "splitwise_code_sample.csv"
    raw = trace_workload(path)
    base = np.array([r.arrival_time for r in generate_requests(load_workload(raw), VOCAB_SIZE)])
    halved = generate_requests(load_workload(raw, ["workload.trace.time_scale=0.5"]), VOCAB_SIZE)
    np.testing.assert_allclose([r.arrival_time for r in halved], base * 0.5)
    at_rate = np.array(
        [r.arrival_time for r in generate_requests(load_workload(raw, ["workload.arrival.rate=20"]), VOCAB_SIZE)]
    )
    assert (len(at_rate) - 1) / at_rate[-1] == pytest.approx(20.0)
    np.testing.assert_allclose(at_rate / at_rate[-1], base / base[-1])
    with pytest.raises(WorkloadError, match="workload.arrival.rate"):
        load_workload(raw, ["workload.arrival.rate=20", "workload.trace.time_scale=2"])


def test_start_offset_and_duration(data_dir):
    path = data_dir / "splitwise_code_sample.csv"
    raw = trace_workload(path)
    raw["workload"]["trace"]["start_offset"] = 10
    requests = generate_requests(load_workload(raw), VOCAB_SIZE)
    assert [r.num_prompt_tokens for r in requests] == [row[1] for row in csv_rows(path)[10:110]]
    del raw["workload"]["num_requests"]
    raw["workload"]["duration_s"] = 30.0
    requests = generate_requests(load_workload(raw), VOCAB_SIZE)
    assert requests and all(r.arrival_time < 30.0 for r in requests)


def test_random_sampling_with_replacement_serves_more_requests_than_rows(data_dir):
    path = data_dir / "splitwise_code_sample.csv"
    raw = trace_workload(path, num_requests=2500, arrival={"type": "poisson", "rate": 50})
    with pytest.raises(WorkloadError, match="workload.num_requests"):
        load_workload(raw)  # sequential: only 1,000 rows
    requests = generate_requests(load_workload(raw, ["workload.trace.sample=random_with_replacement"]), VOCAB_SIZE)
    assert len(requests) == 2500
    rows = {(row[1], row[2]) for row in csv_rows(path)}
    pairs = [(r.num_prompt_tokens, r.output_len) for r in requests]
    assert set(pairs) <= rows
    assert len(set(pairs)) > 500  # drawn from across the trace, with repeats
    with pytest.raises(WorkloadError, match="workload.trace.sample"):
        load_workload(raw, ["workload.trace.sample=random_with_replacement", "workload.arrival={type: trace}"])


def test_trace_lengths_are_clipped_to_the_total_cap(data_dir):
    raw = trace_workload(data_dir / "splitwise_conv_sample.csv", num_requests=2000, max_total_len=1024)
    requests = generate_requests(load_workload(raw), VOCAB_SIZE)
    assert max(r.total_len for r in requests) == 1024


def test_mooncake_equal_hash_ids_give_equal_blocks(data_dir):
    path = data_dir / "mooncake_conversation_sample.jsonl"
    records = read_trace(path)
    with open(path) as handle:
        lines = [json.loads(line) for line in handle][:40]
    raw = trace_workload(path, num_requests=40)
    requests = generate_requests(load_workload(raw), VOCAB_SIZE)
    assert [r.num_prompt_tokens for r in requests] == [line["input_length"] for line in lines]
    assert records.hash_ids_of(1).tolist() == lines[1]["hash_ids"]
    blocks = {}
    for request, line in zip(requests, lines):
        for index, hash_id in enumerate(line["hash_ids"]):
            block = tuple(request.prompt_token_ids[index * MOONCAKE_BLOCK_SIZE : (index + 1) * MOONCAKE_BLOCK_SIZE])
            if len(block) == MOONCAKE_BLOCK_SIZE:
                assert blocks.setdefault(hash_id, block) == block
    # Every request of the sample starts with block 0 (a shared system prompt): one block, many users.
    assert all(line["hash_ids"][0] == 0 for line in lines)
    assert len({block for block in blocks.values()}) == len(blocks)  # distinct ids, distinct blocks
    other_seed = generate_requests(load_workload(raw, ["seed=4"]), VOCAB_SIZE)
    assert other_seed[0].prompt_token_ids != requests[0].prompt_token_ids


def test_mooncake_prompts_cannot_take_a_shared_prefix(data_dir):
    raw = trace_workload(
        data_dir / "mooncake_conversation_sample.jsonl", shared_prefix={"num_groups": 2, "prefix_len": 16}
    )
    with pytest.raises(WorkloadError, match="workload.shared_prefix"):
        load_workload(raw)


def test_malformed_traces_name_the_line(tmp_path):
    bad_csv = tmp_path / "bad.csv"
    bad_csv.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,10,5\n0.5,ten,5\n")
    with pytest.raises(TraceFormatError, match="line 3: num_prefill_tokens"):
        read_trace(bad_csv)
    missing = tmp_path / "missing.csv"
    missing.write_text("time,prompt\n0,1\n")
    with pytest.raises(TraceFormatError, match="missing column"):
        read_trace(missing)
    bad_jsonl = tmp_path / "bad.jsonl"
    bad_jsonl.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [0]}\n{oops\n')
    with pytest.raises(TraceFormatError, match="line 2"):
        read_trace(bad_jsonl)
    with pytest.raises(WorkloadError, match="workload.trace.path: cannot read the trace"):
        load_workload(trace_workload(bad_csv))


HEADER = "arrived_at,num_prefill_tokens,num_decode_tokens\n"


def mooncake_line(input_length: int, hash_ids) -> str:
    return json.dumps({"timestamp": 0, "input_length": input_length, "output_length": 1, "hash_ids": hash_ids})


@pytest.mark.parametrize("name, content, message", [
    # Past int64 these failed as an OverflowError traceback; far below it they are bad data all the same.
    ("huge.csv", HEADER + "0.3,1e30,10\n", r"line 2: num_prefill_tokens must be <= 2147483647 \(got '1e30'\)"),
    ("huge.jsonl", mooncake_line(int(1e30), [1]), r"line 1: input_length must be <= 2147483647"),
    ("huge-id.jsonl", mooncake_line(600, [1, 10**23]), r"line 1: hash_ids must be a list of integers in"),
    # JSON true is a Python int: it must not pass for hash id 1.
    ("bool-id.jsonl", mooncake_line(600, [True, False]), r"line 1: hash_ids must be a list of integers in"),
    # One id per 512-token block: a list of another length would share what the trace never shared.
    ("short.jsonl", mooncake_line(5000, [900000]), r"line 1: hash_ids has 1 ids, but input_length 5000 covers 10"),
    ("long.jsonl", mooncake_line(600, [1, 2, 3]), r"hash_ids has 3 ids, but input_length 600 covers 2 blocks"),
])
def test_trace_values_that_would_overflow_or_mislead_are_refused_by_line(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content + "\n")
    with pytest.raises(TraceFormatError, match=message):
        read_trace(path)


def test_a_byte_order_mark_is_skipped_and_a_non_utf8_file_is_named(tmp_path):
    bom = tmp_path / "excel.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + (HEADER + "0.0,10,5\n").encode())
    assert list(read_trace(bom).prompt_lens) == [10]
    latin = tmp_path / "latin.csv"
    latin.write_bytes(b"\xff\xfe\x00garbage\n")
    with pytest.raises(TraceFormatError, match=r"latin.csv: not UTF-8 text"):
        read_trace(latin)
