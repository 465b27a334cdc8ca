"""Concurrency search (sim/concurrency_capacity.py): the most clients within the SLO, bracketed and bisected."""

from __future__ import annotations

import json

import pytest

from sim.concurrency_capacity import find_max_concurrency, main
from workloads import example_path, load_workload

SMALL = ["sweep=null", "workload.num_requests=96", "workload.prompt_len={type: constant, value: 512}",
         "workload.output_len={type: constant, value: 256}"]


def concurrency_workload(*overrides):
    return load_workload(example_path("concurrency_sweep"), overrides=[*SMALL, *overrides])


def test_the_boundary_passes_and_one_more_client_fails():
    result = find_max_concurrency(concurrency_workload("workload.max_concurrency=4", "slo.tpot_ms=10"))
    assert result.max_concurrency is not None and result.first_failing_concurrency == result.max_concurrency + 1
    by_clients = {probe.max_concurrency: probe for probe in result.probes}
    assert by_clients[result.max_concurrency].passed and not by_clients[result.first_failing_concurrency].passed
    # More clients: each one's tokens come slower, and (over the probed range) the engine serves more in all.
    assert by_clients[result.first_failing_concurrency].tpot_ms_p90 > by_clients[result.max_concurrency].tpot_ms_p90
    assert result.probes[-1].output_token_throughput > result.probes[0].output_token_throughput


def test_a_loose_slo_passes_every_client_count_up_to_the_requests():
    result = find_max_concurrency(concurrency_workload("slo.tpot_ms=1000", "slo.ttft_ms=100000"))
    assert (result.max_concurrency, result.first_failing_concurrency) == (96, None)


def test_one_client_failing_reports_none():
    result = find_max_concurrency(concurrency_workload("workload.max_concurrency=8", "slo.tpot_ms=1"))
    assert result.max_concurrency is None and result.first_failing_concurrency == 1


def test_cli_writes_the_search(tmp_path, capsys):
    out = tmp_path / "search"
    assert main(["concurrency_sweep", *[f"--set={override}" for override in SMALL], "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "concurrent clients" in printed
    saved = json.loads((out / "concurrency.json").read_text())
    assert saved["slo"] == {"ttft_ms": 1000.0, "tpot_ms": 12.0} and saved["probes"]


def test_a_workload_without_an_slo_is_refused_by_name(capsys):
    assert main(["concurrency_sweep", "--set", "slo=null", "--set", "sweep=null"]) == 2
    assert "slo: a concurrency search needs an SLO" in capsys.readouterr().err


@pytest.mark.parametrize("override, field", [("sweep={workload.max_concurrency: [1, 2]}", "workload.max_concurrency"),
                                             ("sweep={engine.max_num_seqs: [8, 16]}", "engine.max_num_seqs")])
def test_a_sweep_is_refused_by_name(override, field):
    with pytest.raises(ValueError, match=f"sweep.{field}"):
        find_max_concurrency(load_workload(example_path("concurrency_sweep"), overrides=[override]))


def test_cli_refuses_a_sweep_of_another_field_and_a_bad_attainment(capsys):
    assert main(["concurrency_sweep", "--set", "sweep={engine.max_num_seqs: [8, 16]}"]) == 2
    assert "sweep.engine.max_num_seqs: a concurrency search runs one configuration" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["concurrency_sweep", "--attainment", "1.5"])
    assert "--attainment" in capsys.readouterr().err
