"""The analytical cost model against measured A100 kernel times.

For each model shape and token count in ``sim/data/a100_mlp_tp1.csv`` (Vidur's published per-operator
A100 profiles, tensor-parallel 1), predict the non-attention part of one transformer layer (QKV, O,
gate+up and down projections, both norms, RoPE, the activation and a residual add) with
``AnalyticalCostModel.layer_operator_times`` and compare with the measured sum of the same kernels.
``--tensor-parallel-size 2|4|8`` does the same for one GPU's shard of each layer
(``sim/data/a100_mlp_tp248.csv``, the same profiles at those degrees; the factors were fitted at 1
only, so these rows are held out). The all-reduces are not in these profiles.

Beside each row, the measured GEMM time is turned into achieved TFLOP/s and GB/s and set against the
datasheet peaks: the small-batch rows should sit near the bandwidth ceiling, the large ones near the
FLOP ceiling, and none above either.

    python -m benchmarks.cost_model_vs_a100                          # table and summary
    python -m benchmarks.cost_model_vs_a100 --tensor-parallel-size 4  # one GPU's shard at TP 4
    python -m benchmarks.cost_model_vs_a100 --json                   # the same as JSON
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from pathlib import Path

import sim
from sim.cost_models.analytical import AnalyticalCostModel
from sim.hardware import HARDWARE_PRESETS, HardwareSpec, resolve_hardware
from sim.model_presets import resolve_model
from sim.model_shapes import dtype_bytes

DATA = Path(sim.__file__).parent / "data" / "a100_mlp_tp1.csv"
DATA_TENSOR_PARALLEL = Path(sim.__file__).parent / "data" / "a100_mlp_tp248.csv"
TENSOR_PARALLEL_SIZES = (1, 2, 4, 8)
DTYPE = "float16"  # the profiles were taken in fp16
# Our operator name -> the profile's column (milliseconds, median of repeated runs).
OPERATOR_COLUMNS = {
    "input_norm": "input_layernorm_ms",
    "qkv_proj": "attn_pre_proj_ms",
    "rope": "attn_rope_ms",
    "o_proj": "attn_post_proj_ms",
    "post_attention_norm": "post_attention_layernorm_ms",
    "gate_up_proj": "mlp_up_proj_ms",
    "activation": "mlp_act_ms",
    "down_proj": "mlp_down_proj_ms",
    "residual_add": "add_ms",
}
GEMMS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def load_measurements(path: Path = DATA, tensor_parallel_size: int = 1) -> list[dict]:
    """The rows measured at ``tensor_parallel_size`` (a file without that column is all degree 1)."""
    with path.open(newline="") as file:
        return [{"model": row["model"], "num_tokens": int(row["num_tokens"]),
                 **{op: float(row[column]) / 1e3 for op, column in OPERATOR_COLUMNS.items()}}
                for row in csv.DictReader(file) if int(row.get("tensor_parallel_size", 1)) == tensor_parallel_size]


def measurement_file(tensor_parallel_size: int) -> Path:
    if tensor_parallel_size not in TENSOR_PARALLEL_SIZES:
        raise ValueError(f"tensor_parallel_size: measured at {TENSOR_PARALLEL_SIZES}, got {tensor_parallel_size!r}")
    return DATA if tensor_parallel_size == 1 else DATA_TENSOR_PARALLEL


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)  # linear interpolation, as numpy.percentile does
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def compare(hardware: str | dict | HardwareSpec = "a100-80gb", path: Path | None = None,
            tensor_parallel_size: int = 1) -> dict:
    """Predicted against measured per-layer times (one GPU's shard at ``tensor_parallel_size``), with
    error summaries per model and per operator."""
    hardware = resolve_hardware(hardware)
    path = path or measurement_file(tensor_parallel_size)
    rows, models = [], {}
    operator_errors: dict[str, list[float]] = {op: [] for op in OPERATOR_COLUMNS}
    for measured in load_measurements(path, tensor_parallel_size):
        name, tokens = measured["model"], measured["num_tokens"]
        if name not in models:
            models[name] = AnalyticalCostModel(resolve_model(name), hardware, DTYPE, tensor_parallel_size)
        cost_model = models[name]
        predicted = cost_model.layer_operator_times(tokens)
        measured_s = sum(measured[op] for op in OPERATOR_COLUMNS)
        predicted_s = sum(predicted[op] for op in OPERATOR_COLUMNS)
        for op in OPERATOR_COLUMNS:
            operator_errors[op].append((predicted[op] - measured[op]) / measured[op])
        # Physics: what the measured GEMMs achieved, against the datasheet.
        gemms = cost_model.layer_linears
        gemm_s = sum(measured[op] for op in GEMMS)
        rows.append({
            "model": name, "num_tokens": tokens,
            "measured_ms": measured_s * 1e3, "predicted_ms": predicted_s * 1e3,
            "error": (predicted_s - measured_s) / measured_s,
            "gemm_bound": "compute" if sum(c.is_compute_bound(tokens) for c in gemms) > len(gemms) / 2 else "memory",
            "measured_gemm_tflops": sum(c.flops(tokens) for c in gemms) / gemm_s / 1e12,
            "measured_gemm_gbps": sum(c.bytes_moved(tokens, dtype_bytes(DTYPE)) for c in gemms) / gemm_s / 1e9,
        })
    summary = {}
    for name in list(models) + ["all"]:
        errors = [abs(r["error"]) for r in rows if name in ("all", r["model"])]
        summary[name] = {"median_ape": statistics.median(errors), "p90_ape": _percentile(errors, 0.9),
                         "num_points": len(errors)}
    return {
        "hardware": hardware.to_dict(),
        "tensor_parallel_size": tensor_parallel_size,
        "dtype": DTYPE,
        "peak_tflops": hardware.peak_flops(DTYPE) / 1e12,
        "peak_gbps": hardware.memory_bandwidth_gbps,
        "rows": rows,
        "summary": summary,
        "operator_median_signed_error": {op: statistics.median(e) for op, e in operator_errors.items()},
        "source": str(path),
    }


def print_report(result: dict) -> None:
    hw = result["hardware"]
    peak_tflops, peak_gbps = result["peak_tflops"], result["peak_gbps"]
    tp = result.get("tensor_parallel_size", 1)
    print(f"{'one GPU of ' + str(tp) + ' (tensor parallel), ' if tp > 1 else ''}measured: {Path(result['source']).name}")
    print(f"hardware {hw['name']}: peak {peak_tflops:.0f} TFLOP/s fp16, {peak_gbps:.0f} GB/s; model uses "
          f"GEMM {hw['gemm_flops_efficiency']:.0%} ({peak_tflops * hw['gemm_flops_efficiency']:.0f} TFLOP/s), "
          f"bandwidth {hw['bandwidth_efficiency']:.0%} ({peak_gbps * hw['bandwidth_efficiency']:.0f} GB/s), "
          f"{hw['kernel_launch_overhead_s'] * 1e6:.1f} us per kernel")
    print(f"{'model':<12} {'tokens':>6} {'measured ms':>12} {'predicted ms':>13} {'error':>7}  {'GEMMs':<8}"
          f"{'measured GEMM TFLOP/s':>22} {'GB/s':>12}")
    for r in result["rows"]:
        print(f"{r['model']:<12} {r['num_tokens']:>6} {r['measured_ms']:>12.4f} {r['predicted_ms']:>13.4f} "
              f"{r['error']:>+7.1%}  {r['gemm_bound']:<8}"
              f"{r['measured_gemm_tflops']:>9.1f} ({r['measured_gemm_tflops'] / peak_tflops:>4.0%} peak)"
              f"{r['measured_gemm_gbps']:>6.0f} ({r['measured_gemm_gbps'] / peak_gbps:>4.0%})")
    print("\nmedian signed error per operator: " + ", ".join(
        f"{op} {e:+.0%}" for op, e in result["operator_median_signed_error"].items()))
    print("\nabsolute percentage error of the per-layer non-attention time:")
    for name, s in result["summary"].items():
        print(f"  {name:<12} median {s['median_ape']:6.1%}   p90 {s['p90_ape']:6.1%}   ({s['num_points']} points)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hardware", default="a100-80gb", choices=sorted(HARDWARE_PRESETS), metavar="PRESET",
                        help="hardware preset to predict with (default a100-80gb; one of %(choices)s)")
    parser.add_argument("--tensor-parallel-size", type=int, default=1, choices=TENSOR_PARALLEL_SIZES,
                        help="compare one GPU's shard at this degree (default 1)")
    parser.add_argument("--json", action="store_true", help="print the full result as JSON")
    args = parser.parse_args(argv)
    result = compare(args.hardware, tensor_parallel_size=args.tensor_parallel_size)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_report(result)


if __name__ == "__main__":
    main()
