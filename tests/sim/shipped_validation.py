"""A shipped profile against a shipped recording of a kind the default profiles cannot price (LoRA, n-gram
speculation): the default is never that profile, ``sim.validate`` without it refuses the run, and with it compares
the run within loose bounds that guard the offline pipeline (the figures are in docs/fidelity.md)."""

from __future__ import annotations

import json
from pathlib import Path


def check_named_profile_validates(run: Path, profile: Path, default_run: Path, refusal: str, out: Path, capsys) -> dict:
    """The checks above; returns the comparison with ``profile``. ``default_run``: a recording whose executor the
    default profile is picked for; ``refusal``: what the refusal without ``profile`` says."""
    from sim.profile_match import default_profile_for
    from sim.validate import main as validate_main

    executor = json.loads((default_run / "summary.json").read_text())["config"]["executor"]
    assert default_profile_for(executor).name == "cpu-small-float32.json"
    assert validate_main(["--real-run", str(run), "--out", str(out / "default"), "--no-dashboard"]) == 2
    assert refusal in capsys.readouterr().err
    assert validate_main(["--real-run", str(run), "--profile", str(profile), "--out", str(out / "validate"),
                          "--no-dashboard"]) == 0
    comparison = json.loads((out / "validate" / "comparison.json").read_text())
    assert abs(comparison["metrics"]["request_throughput"]["relative_error"]) < 0.03
    for key in ("ttft_ms.p50", "tpot_ms.p50", "e2e_ms.p50"):
        assert abs(comparison["metrics"][key]["relative_error"]) < 0.25, key
    assert abs(comparison["step_time_error"]["total"]) < 0.1
    return comparison
