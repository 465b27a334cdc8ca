"""``workload.n``: each prompt's n completions are n requests with vLLM's child ids, one prompt, one arrival
time and their own output lengths; n = 1 is the stream it always was; bad values are named."""

from __future__ import annotations

import pytest

from workloads import WorkloadError, generate_requests, load_workload

VOCAB_SIZE = 1000


def test_completions_share_prompt_and_arrival_and_draw_their_own_lengths(raw_workload):
    raw_workload["workload"]["output_len"] = {"type": "uniform", "min": 1, "max": 500}
    raw_workload["workload"]["num_requests"] = 50
    single = generate_requests(load_workload(raw_workload), VOCAB_SIZE)
    raw_workload["workload"]["n"] = 3
    requests = generate_requests(load_workload(raw_workload), VOCAB_SIZE)
    assert len(requests) == 150
    assert [r.request_id for r in requests[:4]] == ["0_req-000000", "1_req-000000", "2_req-000000", "0_req-000001"]
    for index, prompt in enumerate(single):
        completions = requests[3 * index:3 * index + 3]
        assert {(r.arrival_time, tuple(r.prompt_token_ids), r.priority) for r in completions} == {
            (prompt.arrival_time, tuple(prompt.prompt_token_ids), prompt.priority)}
        # Completion 0 is the prompt's own draw: n changes nothing else in the stream.
        assert completions[0].output_len == prompt.output_len
    lengths = [[r.output_len for r in requests[i:i + 3]] for i in range(0, 150, 3)]
    assert sum(len(set(group)) > 1 for group in lengths) > 40


def test_completions_respect_the_length_cap(raw_workload):
    raw_workload["workload"].update(n=4, output_len={"type": "uniform", "min": 100, "max": 400}, max_total_len=200)
    requests = generate_requests(load_workload(raw_workload), VOCAB_SIZE)
    assert all(r.num_prompt_tokens + r.output_len <= 200 for r in requests)


def test_a_prompt_of_a_trace_repeats_its_output_length(raw_workload, data_dir):
    raw_workload["workload"] = {
        "num_requests": 20, "n": 2, "arrival": {"type": "trace"}, "prompt_len": {"type": "trace"},
        "output_len": {"type": "trace"}, "trace": {"path": str(data_dir / "splitwise_code_sample.csv")},
    }
    requests = generate_requests(load_workload(raw_workload), VOCAB_SIZE)
    assert len(requests) == 40
    assert all(a.output_len == b.output_len for a, b in zip(requests[::2], requests[1::2]))


@pytest.mark.parametrize("n, message", [(0, "greater than 0"), (5000, "less than or equal to 1024"),
                                        (True, "valid integer")])
def test_bad_n_is_named(raw_workload, n, message):
    raw_workload["workload"]["n"] = n
    with pytest.raises(WorkloadError, match=rf"workload\.n: .*{message}"):
        load_workload(raw_workload)


def test_too_many_requests_in_all_is_named(raw_workload):
    raw_workload["workload"].update(num_requests=4_000_000, n=2)
    with pytest.raises(WorkloadError, match=r"workload\.n: gives 8,000,000 requests"):
        load_workload(raw_workload)
