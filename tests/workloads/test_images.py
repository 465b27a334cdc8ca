"""workload.images: its schema's errors, and the prompts it generates."""

from __future__ import annotations

import pytest

from workloads import WorkloadError, generate_requests
from workloads.image_placement import image_token_id
from workloads.loader import load_workload_text

VOCAB = 5000

BASE = """
name: images
model: llama-3-8b
workload:
  num_requests: 200
  arrival: {type: poisson, rate: 5}
  prompt_len: {type: uniform, min: 20, max: 200}
  output_len: {type: uniform, min: 5, max: 50}
  shared_prefix: {num_groups: 2, prefix_len: 16, fraction: 0.5}
"""


def workload(images: str | None, extra: str = ""):
    text = BASE + (f"  images: {images}\n" if images else "") + extra
    return load_workload_text(text)


def test_images_follow_the_leading_tokens_and_the_text_stays_as_it_was():
    plain = generate_requests(workload(None), VOCAB)
    shown = generate_requests(workload("{fraction: 0.6, count: {type: uniform, min: 1, max: 3}, "
                                       "tokens_per_image: {type: uniform, min: 4, max: 40}}"), VOCAB)
    placeholder = image_token_id(VOCAB)
    with_images = [spec for spec in shown if spec.images]
    assert 90 < len(with_images) < 150  # 60% of 200
    for before, after in zip(plain, shown, strict=True):
        # Arrivals and output lengths come from their own streams; the text keeps its length.
        assert (after.arrival_time, after.output_len, after.prefix_group) == \
            (before.arrival_time, before.output_len, before.prefix_group)
        image_tokens = sum(tokens for _, _, tokens in after.images)
        assert after.num_prompt_tokens == before.num_prompt_tokens + image_tokens
        start = 16 if after.prefix_group is not None else 0
        offset = start
        for identifier, image_offset, tokens in after.images:
            assert image_offset == offset and 4 <= tokens <= 40
            assert list(after.prompt_token_ids[offset:offset + tokens]) == [placeholder] * tokens
            offset += tokens
        text = list(after.prompt_token_ids[:start]) + list(after.prompt_token_ids[offset:])
        assert placeholder not in text and len(text) == before.num_prompt_tokens
        assert len({identifier for identifier, _, _ in after.images}) == len(after.images)  # unpooled: all new


def test_a_pool_of_images_gives_each_image_one_size_and_favours_the_first_under_zipf():
    specs = generate_requests(workload("{count: {type: constant, value: 2}, distinct: 10, popularity: {zipf: 1.5}, "
                                       "tokens_per_image: {type: uniform, min: 8, max: 64}}"), VOCAB)
    sizes: dict[str, int] = {}
    uses: dict[str, int] = {}
    for spec in specs:
        assert len(spec.images) == 2
        for identifier, _, tokens in spec.images:
            assert sizes.setdefault(identifier, tokens) == tokens
            uses[identifier] = uses.get(identifier, 0) + 1
    assert len(sizes) <= 10
    most_used = max(uses, key=uses.get)
    assert most_used.endswith("-p0") and uses[most_used] > 400 / 10 * 2


def test_the_total_length_cap_counts_the_images():
    specs = generate_requests(workload("{tokens_per_image: {type: constant, value: 100}}",
                                       "  max_total_len: 180\n"), VOCAB)
    assert all(spec.num_prompt_tokens + spec.output_len <= 180 for spec in specs)
    assert all(spec.images and spec.images[0][2] == 100 for spec in specs)


def test_the_models_own_count_is_the_default_and_required_when_it_has_none():
    specs = generate_requests(workload("{}"), VOCAB, tokens_per_image=256)
    assert all(spec.images[0][2] == 256 for spec in specs)
    with pytest.raises(WorkloadError, match=r"workload.images.tokens_per_image.*must be set"):
        generate_requests(workload("{}"), VOCAB)


@pytest.mark.parametrize("images, message", [
    ("{fraction: 1.5}", "workload.images.fraction"),
    ("{tokens_per_image: {type: trace}}", "cannot be type trace"),
    ("{distinct: 10, popularity: {zipf: -1}}", "popularity"),
    ("{distinct: 0}", "workload.images.distinct"),
    ("{count: 2}", "workload.images.count"),
])
def test_bad_sections_name_the_field(images, message):
    with pytest.raises(WorkloadError, match=message):
        workload(images)


def test_images_are_refused_with_disaggregation_and_kv_offloading():
    with pytest.raises(WorkloadError, match="cluster.prefill_replicas.*images"):
        workload("{}", "cluster: {num_replicas: 2, prefill_replicas: 1}\n")
    with pytest.raises(WorkloadError, match="engine.kv_offloading_size_gib.*images"):
        workload("{}", "engine: {kv_offloading_size_gib: 4}\n")
