"""benchmarks/images.py runs end to end on the generated tiny LLaVA: the engine with new and with repeated images,
and transformers' batches, on the same requests (figures are for the note, not asserted)."""

from __future__ import annotations

import json

from benchmarks.images import main


def test_the_images_benchmark_runs(capsys):
    assert main(["--model", "tiny-llava", "--num-requests", "6", "--pool", "2", "--hf-batch-size", "3", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["engine_new_images_encoded"] == 6 and result["engine_pool_encoded"] <= 2
    assert result["engine_new_images_tokens_per_s"] > 0 and result["transformers_tokens_per_s"] > 0
