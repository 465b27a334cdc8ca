"""How a capacity search reads: the probe table, the answer in a paragraph, a sweep's searches side by side.

Kept apart from the search (sim/capacity.py) so that the search is what a library caller imports and
this is what the CLI prints; both read the same ``CapacityResult``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
from rich.table import Table

from analysis.report import format_number, format_percent

if TYPE_CHECKING:  # the dataclasses live with the search, which imports this module
    from sim.capacity import CapacityResult, Probe


def probe_table(probes: list[Probe]) -> Table:
    table = Table(title="probes (one simulation each)", padding=(0, 1))
    for column in ("rate (req/s)", "SLO met", "pass", "goodput", "TTFT p90 (ms)", "TPOT p90 (ms)", "E2E p90 (ms)"):
        table.add_column(column, justify="right")
    for result in probes:
        table.add_row(f"{result.rate:.4g}", format_percent(result.slo_attainment),
                      "yes" if result.passed else "no", format_number(result.goodput),
                      format_number(result.ttft_p90_ms), format_number(result.tpot_p90_ms),
                      format_number(result.e2e_p90_ms))
    return table


def describe(result: CapacityResult) -> str:
    slo = ", ".join(f"{key} <= {value:g}" for key, value in result.slo.items())
    share = f"{result.attainment_target * 100:g}% of requests"  # :.0% would call 0.999 100%
    if result.max_rate is None:
        return (f"no rate down to {result.probes[0].rate:.4g} req/s met {slo} for {share}: the SLO is out of "
                "reach at any load (is a threshold below the time a lone request takes?)")
    if result.first_failing_rate is None:
        return f"every rate up to {result.max_rate:.4g} req/s met {slo} for {share}; the search stopped there"
    line = (f"capacity: {result.max_rate:.4g} req/s meets {slo} for {share} "
            f"({result.first_failing_rate:.4g} req/s does not)")
    if result.replicas is not None and result.cluster_size > 1:
        line += (f"; {result.target_rate:g} req/s needs {result.replicas} replicas "
                 f"({result.replicas // result.cluster_size} cluster(s) of {result.cluster_size}, the traffic split "
                 "evenly between the clusters)")
    elif result.replicas is not None:
        line += (f"; {result.target_rate:g} req/s needs {result.replicas} replica(s), "
                 "with the traffic split evenly between them")
    if result.replicas is not None and result.gpus_per_replica > 1:
        line += f" ({result.replicas * result.gpus_per_replica} GPUs at {result.gpus_per_replica} per replica)"
    count = result.replica_count
    if count is not None:
        failing = [check for check in count.checks if not check.passed]
        below = (f" ({failing[-1].replicas} replica(s): {format_percent(failing[-1].slo_attainment)} of requests "
                 "met it)" if failing else "")
        if count.fewest_passing is None:
            line += (f"\nsimulated as one cluster behind its router ({count.router}), none of "
                     f"{count.checks[0].replicas}-{count.checks[-1].replicas} replicas met it{below}")
        else:
            gpus = (f" ({count.fewest_passing * result.gpus_per_replica} GPUs)" if result.gpus_per_replica > 1
                    else "")
            if result.prefill_replicas:
                prefill = count.fewest_passing // result.cluster_size * result.prefill_replicas
                gpus += f" ({prefill} prefill + {count.fewest_passing - prefill} decode)"
            line += (f"\nsimulated as one cluster behind its router ({count.router}): "
                     f"{count.fewest_passing} replica(s){gpus} meet it{below}")
    elif result.verification_note is not None:
        line += f"\n{result.verification_note}"
    if result.usd_per_million_output_tokens is not None:
        tokens_per_s = result.sustained_output_tokens_per_s()
        line += (f"\nat the capacity, {tokens_per_s:,.0f} output tokens/s on {result.num_gpus} GPU(s) "
                 f"at ${result.gpu_hour_price:g} per GPU-hour: ${result.usd_per_million_output_tokens:.3f} per million "
                 "output tokens")
    return line


def point_table(results: list[tuple[str, CapacityResult]]) -> Table:
    """A sweep's searches side by side: which configuration sustains how much."""
    table = Table(title="capacity per sweep point", padding=(0, 1))
    priced = any(result.gpu_hour_price is not None for _, result in results)
    columns = ("point", "capacity (req/s)", "fails at (req/s)", "probes", "replicas", "simulated")
    for column in columns + (("$ per M output tokens",) if priced else ()):
        # Sweep labels share their prefix ("tensor_parallel_size=4", "=8"): fold, never cut them.
        table.add_column(column, justify="left" if column == "point" else "right",
                         overflow="fold" if column == "point" else "ellipsis")
    for label, result in results:
        simulated = simulated_replicas(result)
        cells = [label, _rate_text(result.max_rate), _rate_text(result.first_failing_rate),
                 str(len(result.probes)), "-" if result.replicas is None else str(result.replicas),
                 "-" if simulated is None else str(simulated)]
        if priced:
            cost = result.usd_per_million_output_tokens
            cells.append("-" if cost is None else f"{cost:.3f}")
        table.add_row(*cells)
    return table


def simulated_replicas(result: CapacityResult) -> int | None:
    """The replicas the target rate needs as one simulated cluster, where that was found."""
    return result.replica_count.fewest_passing if result.replica_count is not None else None


def write_point_table(results: list[tuple[str, CapacityResult]], path: Path) -> None:
    rows = [{"point": label, "max_rate": result.max_rate, "first_failing_rate": result.first_failing_rate,
             "num_probes": len(result.probes), "replicas": result.replicas,
             "replicas_simulated": simulated_replicas(result), "num_gpus": result.num_gpus,
             "usd_per_million_output_tokens": result.usd_per_million_output_tokens} for label, result in results]
    pd.DataFrame(rows).to_csv(path, index=False)


def _rate_text(rate: float | None) -> str:
    return "-" if rate is None else f"{rate:.4g}"
