"""The kernel benchmark's table and verdicts, on results shaped as a GPU run writes them.

``python -m benchmarks.kernels`` measures only on a GPU, which is lent rarely and briefly: a table that
fails to print there wastes the measurement. So its report is checked here, on the CPU, against a
results object of the shape ``main`` builds.
"""

import pytest

pytest.importorskip("torch")

from benchmarks.kernels import TARGET_DECODE_RATIO, print_table, verdicts  # noqa: E402


def gpu_like_results(decode_ratio: float) -> dict:
    decode = {"kernel": "paged_decode/triton", "case": "batch 16, context 4096", "block_size": 256, "us": 30.0,
              "gb_per_s": 1200.0, "graph_us": 20.0, "us_by_kv_split": {1: 60.0, 2: 40.0, 4: 31.0, 8: 29.0, 16: 33.0},
              "best_kv_split": 8, "best_kv_split_us": 29.0, "flash_attn_us": 30.0 / decode_ratio,
              "ratio_vs_flash_attn": decode_ratio, "flash_baseline": "torch-bundled FlashAttention-2 (paged)",
              "flash_attn_graph_us": 18.0, "graph_ratio_vs_flash_attn": 20.0 / 18.0}
    return {"device": "a GPU", "copy": {"kernel": "copy", "case": "1 GiB", "us": 250.0, "gb_per_s": 4000.0},
            "reshape_and_cache": [{"kernel": "reshape_and_cache/triton", "case": "65536 tokens", "tokens": 65536,
                                   "cache_dtype": "bf16", "us": 100.0, "gb_per_s": 3400.0}],
            "paged_decode": [decode, {"kernel": "paged_decode/triton", "case": "batch 16, context 4096",
                                      "block_size": 16, "us": 35.0, "gb_per_s": 1000.0}]}


def test_the_table_prints_every_row_the_split_sweep_and_the_verdicts(capsys):
    print_table(gpu_like_results(decode_ratio=1.36))
    printed = capsys.readouterr().out
    assert "copy bandwidth (ceiling): 4000 GB/s" in printed
    assert "us by split-KV count (1: 60.0, 2: 40.0, 4: 31.0, 8: 29.0, 16: 33.0): best 8, default 30.0 us" in printed
    assert "target reshape_and_cache/triton >= 80% of copy at 65536 tokens: 85% (met)" in printed
    assert f"target triton decode <= {TARGET_DECODE_RATIO}x flash-attn (eager calls" in printed
    assert "worst 1.36x" in printed and "(NOT met)" in printed
    # The sweep's fastest split: 29 us against flash-attn's 30 / 1.36 = 22.1 us, 1.31x, just short.
    assert "with the fastest split-KV count per case instead of the default: worst 1.31x (NOT met)" in printed


@pytest.mark.parametrize("ratio, verdict", [(1.2, "(met)"), (1.4, "(NOT met)")])
def test_the_decode_verdict_follows_the_worst_ratio(ratio, verdict):
    eager = [line for line in verdicts(gpu_like_results(ratio)) if "eager calls" in line]
    assert len(eager) == 1 and eager[0].endswith(verdict)
