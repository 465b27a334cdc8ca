"""engine.speculative_decoding: what it accepts, and the errors that name what it refuses."""

from __future__ import annotations

import pytest

from workloads import WorkloadError, load_workload


def speculative(raw_workload, **section):
    raw_workload.setdefault("engine", {})["speculative_decoding"] = section
    return load_workload(raw_workload)


def test_absent_is_off_and_a_rate_applies_to_every_position(raw_workload):
    assert load_workload(raw_workload).engine.speculative_decoding is None
    section = speculative(raw_workload, num_speculative_tokens=3, acceptance_rate=0.6).engine.speculative_decoding
    assert section.method == "ngram" and section.draft_model is None
    assert section.acceptance_by_position() == [0.6, 0.6, 0.6]
    assert speculative(raw_workload, num_speculative_tokens=2, acceptance_rate=1).engine.speculative_decoding \
        .acceptance_by_position() == [1.0, 1.0]


def test_a_list_gives_each_position_its_own_probability(raw_workload):
    section = speculative(raw_workload, num_speculative_tokens=2, acceptance_rate=[0.8, 0.5, 0.3]) \
        .engine.speculative_decoding
    assert section.acceptance_by_position() == [0.8, 0.5]  # entries past num_speculative_tokens unused
    off = speculative(raw_workload, num_speculative_tokens=0, acceptance_rate=[0.8]).engine.speculative_decoding
    assert off.acceptance_by_position() == []


def test_a_draft_model_is_named_only_for_its_method(raw_workload):
    section = speculative(raw_workload, num_speculative_tokens=4, acceptance_rate=0.7, method="draft_model",
                          draft_model="llama-3.2-1b").engine.speculative_decoding
    assert (section.method, section.draft_model) == ("draft_model", "llama-3.2-1b")


@pytest.mark.parametrize("section, field, message", [
    ({"num_speculative_tokens": 3, "acceptance_rate": 0}, "acceptance_rate", "probability in (0, 1]"),
    ({"num_speculative_tokens": 3, "acceptance_rate": 1.2}, "acceptance_rate", "probability in (0, 1]"),
    ({"num_speculative_tokens": 3, "acceptance_rate": True}, "acceptance_rate", "probability in (0, 1]"),
    ({"num_speculative_tokens": 3, "acceptance_rate": "high"}, "acceptance_rate", "probability in (0, 1]"),
    ({"num_speculative_tokens": 3, "acceptance_rate": []}, "acceptance_rate", "at least one probability"),
    ({"num_speculative_tokens": 3, "acceptance_rate": [0.9, 0.7]}, "acceptance_rate",
     "lists 2 per-position probabilities, but num_speculative_tokens is 3"),
    ({"num_speculative_tokens": 2, "acceptance_rate": [0.9, -0.1]}, "acceptance_rate", "not [1] -0.1"),
    ({"num_speculative_tokens": -1, "acceptance_rate": 0.5}, "num_speculative_tokens", "greater than or equal to 0"),
    ({"num_speculative_tokens": 33, "acceptance_rate": 0.5}, "num_speculative_tokens", "less than or equal to 32"),
    ({"acceptance_rate": 0.5}, "num_speculative_tokens", "missing"),
    ({"num_speculative_tokens": 2}, "acceptance_rate", "missing"),
    ({"num_speculative_tokens": 2, "acceptance_rate": 0.5, "method": "medusa"}, "method",
     "'ngram', 'draft_model', 'mtp', 'eagle' or 'eagle3'"),
    ({"num_speculative_tokens": 2, "acceptance_rate": 0.5, "method": "draft_model"}, "draft_model",
     "method draft_model needs the draft model"),
    ({"num_speculative_tokens": 2, "acceptance_rate": 0.5, "draft_model": "llama-3.2-1b"}, "draft_model",
     "only used with methods draft_model, eagle and eagle3"),
    ({"num_speculative_tokens": 2, "acceptance_rate": 0.5, "num_drafts": 2}, "num_drafts", "unknown key"),
])
def test_bad_sections_name_the_field(raw_workload, section, field, message):
    with pytest.raises(WorkloadError) as error:
        speculative(raw_workload, **section)
    text = str(error.value)
    assert f"engine.speculative_decoding.{field}" in text and message in text, text


def test_a_sweep_over_the_drafts_can_start_from_off(raw_workload):
    raw_workload["engine"] = {"speculative_decoding": {"num_speculative_tokens": 0, "acceptance_rate": 0.7}}
    raw_workload["sweep"] = {"engine.speculative_decoding.num_speculative_tokens": [0, 1, 3]}
    points = load_workload(raw_workload).sweep_points()
    assert [label for label, _ in points] == ["num_speculative_tokens=0", "num_speculative_tokens=1",
                                              "num_speculative_tokens=3"]
    assert [point.engine.speculative_decoding.acceptance_by_position() for _, point in points] == \
        [[], [0.7], [0.7, 0.7, 0.7]]
