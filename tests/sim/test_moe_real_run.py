"""A real run of a mixture of experts (a generated tiny Mixtral, CPU) and its replay: the same workload YAML as a
dense model's, the same run directory, every scheduling decision reproduced by the simulator."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from analysis import read_run  # noqa: E402
from engine.models import make_test_model  # noqa: E402
from sim.real_engine import build_real_engine  # noqa: E402
from sim.real_run import run_real  # noqa: E402
from sim.replay import run_replay  # noqa: E402
from workloads import load_workload  # noqa: E402

from tests.sim.test_real_runs import WORKLOAD  # noqa: E402


def test_a_mixtral_real_run_replays_exactly(tmp_path):
    path = make_test_model(tmp_path / "mixtral", "mixtral", seed=2, with_tokenizer=True)
    workload = load_workload(dict(WORKLOAD, model=str(path), workload=dict(WORKLOAD["workload"], num_requests=20)))
    real = build_real_engine(workload, model=str(path), threads=1)
    assert type(real.engine.executor.model_runner.model).__name__ == "MixtralForCausalLM"
    out = tmp_path / "real"
    result = run_real(workload, out, real.engine, vocab_size=real.vocab_size,
                      reserved_token_ids=real.reserved_token_ids, executor_info=real.info)
    assert result.summary["num_finished"] == 20
    assert read_run(out).steps["num_preemptions"].sum() > 0  # the workload's small pool preempts
    _, report = run_replay(out, tmp_path / "replay")
    assert report.identical, report.describe()
