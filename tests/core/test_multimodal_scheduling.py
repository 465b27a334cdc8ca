"""Multimodal items in the core: the encoder budget and cache, block hashes keyed by images, and bad input.

The state machines (test_multimodal_state_machine.py) check the invariants on random runs; these pin the cases
by name, each with the figures vLLM's scheduler gives for it.
"""

from __future__ import annotations

import pytest

from engine.core import RequestStatus, hash_request_blocks
from engine.core.encoder_cache_manager import EncoderCacheManager
from engine.core.multimodal import MultiModalFeature
from engine.core.request import Request

from tests.core.helpers import check_scheduler_invariants, make_core, make_request, run_to_completion

IMAGE = 9999


def image_prompt(text_before: int, image_tokens: int, text_after: int, start: int = 100) -> list[int]:
    return (list(range(start, start + text_before)) + [IMAGE] * image_tokens
            + list(range(start + 500, start + 500 + text_after)))


def step(core):
    result = core.step()
    check_scheduler_invariants(core.scheduler)
    assert core.executor.encoder_outputs == set(core.scheduler.encoder_cache_manager.sizes)
    return result.scheduler_output


def test_the_encoder_budget_stops_a_chunk_before_an_image_it_cannot_encode():
    # Two images of 8 tokens, a budget of 10 encoder tokens a step: the first step encodes the first image and
    # stops its chunk where the second begins; the next step encodes the second.
    core = make_core(block_size=4, max_num_batched_tokens=64, max_num_encoder_input_tokens=10, encoder_cache_size=64)
    prompt = image_prompt(2, 8, 2) + [IMAGE] * 8 + [7, 8]
    features = [MultiModalFeature("first", 2, 8), MultiModalFeature("second", 12, 8)]
    core.add_request(make_request("r", prompt, max_tokens=2, mm_features=features))
    output = step(core)
    assert output.num_scheduled_tokens == {"r": 12}
    assert output.scheduled_encoder_inputs == {"r": [0]} and output.num_encoder_tokens == 8
    output = step(core)
    assert output.num_scheduled_tokens == {"r": len(prompt) - 12}
    assert output.scheduled_encoder_inputs == {"r": [1]}
    assert run_to_completion(core)["r"]["finish_reason"] == "length"


def test_an_image_shown_twice_is_encoded_once_and_its_blocks_are_prefix_hits():
    core = make_core(block_size=4, max_num_batched_tokens=64)
    prompt = image_prompt(4, 8, 6)
    features = [MultiModalFeature("cat", 4, 8)]
    core.add_request(make_request("a", prompt, max_tokens=1, mm_features=features))
    output = step(core)
    assert output.scheduled_encoder_inputs == {"a": [0]}
    run_to_completion(core)
    # Same image, another question after it: the KV of the image's blocks is a prefix hit (no encoder at all)...
    core.add_request(make_request("b", prompt[:12] + [1, 2, 3, 4, 5], max_tokens=1, mm_features=features))
    output = step(core)
    assert output.scheduled_new_reqs[0].num_computed_tokens == 12
    assert output.scheduled_encoder_inputs == {}
    run_to_completion(core)
    # ...and when the hit stops inside the image, its kept encoder output serves the rest: nothing is encoded.
    core.add_request(make_request("c", [1, 2, 3, 4] + prompt[4:], max_tokens=1,
                                  mm_features=[MultiModalFeature("cat", 4, 8)]))
    output = step(core)
    assert output.scheduled_new_reqs[0].num_computed_tokens == 0
    assert output.scheduled_encoder_inputs == {} and "cat" in core.executor.encoder_outputs


def test_prompts_with_different_images_share_no_block_that_overlaps_them():
    prompt = image_prompt(6, 8, 6)
    cat = hash_request_blocks(prompt, 4, mm_features=[MultiModalFeature("cat", 6, 8)])
    dog = hash_request_blocks(prompt, 4, mm_features=[MultiModalFeature("dog", 6, 8)])
    text = hash_request_blocks(prompt, 4)
    # Block 0 (positions 0-3) holds text only; from block 1 (positions 4-7, the image from 6) they part.
    assert cat[0] == dog[0] == text[0]
    assert len({cat[1], dog[1], text[1]}) == 3 and all(c != d for c, d in zip(cat[1:], dog[1:]))
    # The hasher a request carries gives the same chain.
    core = make_core(block_size=4)
    core.add_request(make_request("a", prompt, mm_features=[MultiModalFeature("cat", 6, 8)]))
    assert core.scheduler.requests["a"].block_hashes == cat


def test_freeable_outputs_are_evicted_oldest_first_and_the_runner_is_told():
    # A cache of 20 tokens: three 8-token images cannot all stay; the oldest released goes first.
    core = make_core(block_size=4, max_num_batched_tokens=64, encoder_cache_size=20, enable_prefix_caching=False)
    for index, name in enumerate(["one", "two", "three"]):
        core.add_request(make_request(name, image_prompt(2, 8, 2, start=100 * index), max_tokens=1,
                                      mm_features=[MultiModalFeature(name, 2, 8)]))
        output = step(core)
        run_to_completion(core)
        if name == "three":
            assert output.free_encoder_mm_hashes == ["one"]
    assert set(core.scheduler.encoder_cache_manager.sizes) == {"two", "three"}


def test_the_last_prompt_token_may_start_an_image():
    # A one-token image at the very end of the prompt, reached by a one-token chunk (the decode fast path's
    # shape): it is still encoded before its position is computed.
    core = make_core(block_size=4, max_num_batched_tokens=64, long_prefill_token_threshold=9)
    prompt = list(range(100, 109)) + [IMAGE]
    core.add_request(make_request("r", prompt, max_tokens=2, mm_features=[MultiModalFeature("dot", 9, 1)]))
    assert step(core).num_scheduled_tokens == {"r": 9}
    output = step(core)
    assert output.num_scheduled_tokens == {"r": 1} and output.scheduled_encoder_inputs == {"r": [0]}
    run_to_completion(core)


def test_without_chunked_items_a_chunk_never_ends_inside_an_image():
    core = make_core(block_size=4, max_num_batched_tokens=10, disable_chunked_mm_input=True)
    prompt = image_prompt(4, 8, 4)
    core.add_request(make_request("r", prompt, max_tokens=1, mm_features=[MultiModalFeature("cat", 4, 8)]))
    assert step(core).num_scheduled_tokens == {"r": 4}  # 10 would end inside the image: cut before it
    output = step(core)
    assert output.num_scheduled_tokens == {"r": 10} and output.scheduled_encoder_inputs == {"r": [0]}


def test_without_chunked_items_a_chunk_that_starts_on_an_image_waits_for_room_for_all_of_it():
    """vLLM's check (``num_computed < start``) lets a chunk that starts exactly on an item end inside it (its issue
    #52306); here it waits for a step with room for the whole item."""
    core = make_core(block_size=4, max_num_batched_tokens=10, disable_chunked_mm_input=True)
    core.add_request(make_request("text", list(range(200, 206)), max_tokens=3))
    core.add_request(make_request("r", image_prompt(0, 8, 4), max_tokens=1, mm_features=[MultiModalFeature("cat", 0, 8)]))
    assert step(core).num_scheduled_tokens == {"text": 6}  # 4 left would end inside the image
    output = step(core)
    assert output.num_scheduled_tokens == {"text": 1, "r": 9} and output.scheduled_encoder_inputs == {"r": [0]}


def test_without_chunked_items_a_kept_image_is_not_split_either():
    """The image's output is kept from another request: vLLM's check passes such an item over, so a chunk could end
    inside it; a model whose image tokens attend each other both ways needs it whole."""
    core = make_core(block_size=4, max_num_batched_tokens=12, disable_chunked_mm_input=True)
    core.add_request(make_request("first", image_prompt(2, 8, 1), max_tokens=4,
                                  mm_features=[MultiModalFeature("cat", 2, 8)]))
    assert step(core).num_scheduled_tokens == {"first": 11}
    assert "cat" in core.scheduler.encoder_cache_manager.sizes
    core.add_request(make_request("second", image_prompt(6, 8, 2, start=300), max_tokens=1,
                                  mm_features=[MultiModalFeature("cat", 6, 8)]))
    output = step(core)
    # 11 tokens of budget would end inside the kept image (6 + 8): cut before it.
    assert output.num_scheduled_tokens == {"first": 1, "second": 6} and not output.scheduled_encoder_inputs
    output = step(core)
    assert output.num_scheduled_tokens == {"first": 1, "second": 10}
    run_to_completion(core)


def test_a_preempted_request_gives_its_outputs_back_and_encodes_again_only_if_evicted():
    core = make_core(block_size=4, num_gpu_blocks=6, max_num_batched_tokens=8, enable_prefix_caching=False)
    prompt = image_prompt(0, 6, 8)
    core.add_request(make_request("a", prompt, max_tokens=6, mm_features=[MultiModalFeature("cat", 0, 6)]))
    core.add_request(make_request("b", image_prompt(0, 2, 6, start=300), max_tokens=6,
                                  mm_features=[MultiModalFeature("dog", 0, 2)]))
    saw_preemption = False
    while core.has_work():
        output = step(core)
        if output is not None and output.preempted_req_ids:
            saw_preemption = True
    assert saw_preemption
    encoder = core.scheduler.encoder_cache_manager
    assert not encoder.holders and encoder.num_reclaimable_slots == encoder.cache_size


def test_an_output_allocated_for_a_request_preempted_in_the_same_step_leaves_the_cache():
    encoder = EncoderCacheManager(cache_size=32)
    request = Request("victim", [IMAGE] * 8, mm_features=[MultiModalFeature("cat", 0, 8)])
    encoder.begin_step(16)
    assert encoder.can_allocate(8, 0)
    encoder.allocate("victim", "cat", 8)
    assert encoder.budget_left == 8
    encoder.release_request(request)  # preempted before the step ran: "cat" was never computed
    assert not encoder.is_cached("cat") and encoder.budget_left == 16 and encoder.num_free_slots == 32
    assert encoder.end_step([]) == {}
    # Held by a second request of the step, it stays, and is computed for that one.
    other = Request("other", [1] + [IMAGE] * 8, mm_features=[MultiModalFeature("cat", 1, 8)])
    encoder.begin_step(16)
    encoder.allocate("victim", "cat", 8)
    encoder.hold("other", "cat")
    encoder.release_request(request)
    other.num_computed_tokens = 5
    assert encoder.end_step([(other, 5)]) == {"other": [0]}


def test_a_prompt_whose_image_cannot_fit_is_ignored_with_the_limit_named():
    core = make_core(block_size=4, max_num_batched_tokens=16, encoder_cache_size=12)
    core.add_request(make_request("r", image_prompt(2, 14, 2), mm_features=[MultiModalFeature("big", 2, 14)]))
    outputs = run_to_completion(core)
    assert outputs["r"]["finish_reason"] == "ignored"
    assert core.scheduler.requests == {}
    core = make_core(block_size=4, max_num_batched_tokens=16, enable_chunked_prefill=False,
                     max_num_encoder_input_tokens=10)
    request = make_request("r", image_prompt(0, 6, 0) + [IMAGE] * 6,
                           mm_features=[MultiModalFeature("a", 0, 6), MultiModalFeature("b", 6, 6)])
    core.add_request(request)
    assert request.status == RequestStatus.FINISHED_IGNORED
    assert "12 encoder tokens, more than max_num_encoder_input_tokens 10" in request.status_message


@pytest.mark.parametrize("features, message", [
    ([MultiModalFeature("a", 2, 4), MultiModalFeature("b", 4, 2)], "inside or before the item before it"),
    ([MultiModalFeature("a", 6, 8)], "past the prompt's 10 tokens"),
    ([MultiModalFeature("a", 0, 0)], "length must be >= 1"),
    ([MultiModalFeature("", 0, 2)], "identifier must be a non-empty string"),
])
def test_bad_items_are_refused_with_the_item_named(features, message):
    with pytest.raises(ValueError, match=message):
        Request("r", list(range(10)), mm_features=features)


def test_items_with_kv_transfer_are_refused():
    core = make_core()
    with pytest.raises(ValueError, match="not supported with KV transfer"):
        core.add_request(make_request("r", image_prompt(0, 4, 4), mm_features=[MultiModalFeature("a", 0, 4)],
                                      do_remote_decode=True))
    assert core.scheduler.requests == {}
