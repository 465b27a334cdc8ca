"""The core's part of multi-LoRA serving: adapters in the prefix cache's keys and the max_loras admission rule."""

from __future__ import annotations

import pytest

from engine.core import LoRARequest, SchedulerConfig, hash_request_blocks

from tests.core.helpers import check_scheduler_invariants, make_core, make_request

ADAPTER_A = LoRARequest("sql", 1, "/adapters/sql")
ADAPTER_B = LoRARequest("chat", 2, "/adapters/chat")


@pytest.mark.parametrize("kwargs, field", [
    ({"lora_name": "", "lora_int_id": 1}, "lora_name"),
    ({"lora_name": "a", "lora_int_id": 0}, "lora_int_id"),
    ({"lora_name": "a", "lora_int_id": True}, "lora_int_id"),
    ({"lora_name": "a", "lora_int_id": 1, "lora_path": 3}, "lora_path"),
])
def test_a_bad_lora_request_names_its_field(kwargs, field):
    with pytest.raises(ValueError, match=f"LoRARequest.{field}"):
        LoRARequest(**kwargs)


def test_max_loras_is_checked():
    with pytest.raises(ValueError, match=r"scheduler.max_loras must be an integer >= 0, got -1"):
        SchedulerConfig(max_loras=-1)


def test_an_adapter_changes_every_block_hash_and_the_salt_still_counts():
    tokens = list(range(64))
    base = hash_request_blocks(tokens, 16)
    sql = hash_request_blocks(tokens, 16, lora_request=ADAPTER_A)
    assert len(sql) == 4 and not set(base) & set(sql)
    # The name and the id key it (the runner refuses one id for two folders, so the path need not); a name
    # loaded again under a new id (the server's /v1/load_lora_adapter after an unload) misses the old KV.
    assert hash_request_blocks(tokens, 16, lora_request=LoRARequest("sql", 1, "/elsewhere")) == sql
    assert not set(hash_request_blocks(tokens, 16, lora_request=LoRARequest("sql", 7, "/adapters/sql"))) & set(sql)
    assert not set(hash_request_blocks(tokens, 16, lora_request=LoRARequest("chat", 1, "/adapters/sql"))) & set(sql)
    salted = hash_request_blocks(tokens, 16, cache_salt="t", lora_request=ADAPTER_A)
    assert not set(salted) & (set(sql) | set(hash_request_blocks(tokens, 16, cache_salt="t")))


def test_a_request_naming_an_adapter_is_refused_when_lora_is_off():
    core = make_core()
    with pytest.raises(ValueError, match=r"'r1' names LoRA adapter 'sql' but LoRA is off \(scheduler.max_loras=0\)"):
        core.add_request(make_request("r1", range(10), lora_request=ADAPTER_A))
    assert not core.scheduler.requests


def test_a_second_adapter_waits_for_a_slot_while_others_overtake_it():
    core = make_core(max_loras=1, num_gpu_blocks=100)
    scheduler = core.scheduler
    core.add_request(make_request("a1", range(20), max_tokens=5, lora_request=ADAPTER_A))
    core.add_request(make_request("b1", range(100, 120), max_tokens=5, lora_request=ADAPTER_B))
    core.add_request(make_request("a2", range(200, 220), max_tokens=5, lora_request=ADAPTER_A))
    core.add_request(make_request("base", range(300, 320), max_tokens=5))
    output = scheduler.schedule()
    # b1 is passed over (its adapter has no slot); a2, same adapter as a1, and the base-model request are not.
    assert [new.req_id for new in output.scheduled_new_reqs] == ["a1", "a2", "base"]
    assert [new.lora_request for new in output.scheduled_new_reqs] == [ADAPTER_A, ADAPTER_A, None]
    assert [request.request_id for request in scheduler.waiting] == ["b1"]
    scheduler.update_from_output(output, core.executor.execute_model(output))
    finished = set()
    for _ in range(50):
        check_scheduler_invariants(scheduler)
        running = {request.request_id for request in scheduler.running}
        if "b1" in running:
            break
        finished |= {output.request_id for output in core.step().outputs if output.finish_reason}
    # b1 started only once both requests of adapter A had finished.
    assert "b1" in running and {"a1", "a2"} <= finished
