"""Concurrency search: the most clients one engine (or cluster) serves at once within the workload's SLO.

    python -m sim.concurrency_capacity [WORKLOAD.yaml] [--set PATH=VALUE ...] [--attainment 0.9]

The closed-loop twin of ``sim.capacity``'s rate search, and the question behind vLLM's ``bench serve
--max-concurrency``: with N clients each sending its next request when the previous one finishes
(``workload.max_concurrency``; usually with ``arrival: {type: at_once}``), how large may N grow before the
SLO breaks? Latencies count from each request's send, as the benchmark's do, so more clients show up as
longer queues inside the engine and larger batches (TTFT and TPOT), not as waiting at the client. A probe
simulates the workload at one N (the same requests at every N); the search doubles or halves from the
workload's own limit (1 without one) until it brackets the boundary, then bisects the integers. N never
grows past the request count, where the limit no longer binds.

Attainment on a finite request stream is not exactly monotonic in N, so the answer is a boundary between a
passing and a failing N found by bisection, as ``sim.capacity``'s is.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from analysis.report import format_percent, summary_value
from sim.cli_support import check_output_directory, positive_fraction, warnings_as_lines
from sim.run import resolve_workload_path
from sim.run_pipeline import run_simulation
from workloads import WorkloadConfig, WorkloadError, load_workload


@dataclass
class ConcurrencyProbe:
    max_concurrency: int
    slo_attainment: float | None
    passed: bool
    output_token_throughput: float | None  # tok/s over the run
    ttft_ms_p90: float | None
    tpot_ms_p90: float | None
    e2e_ms_p90: float | None
    num_requests: int = 0  # requests the run sent (sessions' later turns included)


@dataclass
class ConcurrencyResult:
    workload: str
    slo: dict
    attainment_target: float
    num_requests: int
    max_concurrency: int | None  # the most clients that passed; None if even one client fails the SLO
    first_failing_concurrency: int | None  # the fewest above it that failed; None if none did
    probes: list[ConcurrencyProbe] = field(default_factory=list)


def check_searchable(workload: WorkloadConfig) -> None:
    """The workloads a concurrency search means something for; a ValueError names what stands in the way."""
    if workload.slo is None or not workload.slo.model_dump(exclude_none=True):
        raise ValueError("slo: a concurrency search needs an SLO (ttft_ms, tpot_ms or e2e_ms) to pass or fail")
    if workload.sweep and "workload.max_concurrency" in workload.sweep:
        raise ValueError("sweep.workload.max_concurrency: a concurrency search varies the limit itself; drop the "
                         "sweep (--set sweep=null)")
    if workload.sweep:
        raise ValueError(f"sweep.{next(iter(workload.sweep))}: a concurrency search runs one configuration; set that "
                         "field and drop the sweep (--set sweep=null)")


def probe(workload: WorkloadConfig, max_concurrency: int, attainment_target: float, cost_model: str | None = None,
          out_dir: Path | None = None) -> ConcurrencyProbe:
    result = run_simulation(workload.with_overrides([f"workload.max_concurrency={max_concurrency}"]), out_dir,
                            cost_model=cost_model)
    summary = result.summary
    attainment = summary.get("slo_attainment")
    return ConcurrencyProbe(max_concurrency, attainment, attainment is not None and attainment >= attainment_target,
                            summary.get("output_token_throughput"), summary_value(summary, "ttft_ms.p90"),
                            summary_value(summary, "tpot_ms.p90"), summary_value(summary, "e2e_ms.p90"),
                            result.num_requests)


def find_max_concurrency(workload: WorkloadConfig, attainment_target: float = 0.9, cost_model: str | None = None,
                         on_probe=None) -> ConcurrencyResult:
    """Bracket the most clients that pass by doubling or halving from the workload's limit, then bisect."""
    check_searchable(workload)
    probes: dict[int, ConcurrencyProbe] = {}

    def passes(clients: int) -> bool:
        if clients not in probes:
            probes[clients] = probe(workload, clients, attainment_target, cost_model)
            if on_probe is not None:
                on_probe(probes[clients])
        return probes[clients].passed

    start = workload.workload.max_concurrency or 1
    low = high = None
    first_passed = passes(start)
    num_requests = probes[start].num_requests
    if start > num_requests:  # the limit does not bind: as many clients as requests is the same run
        start = num_requests
        first_passed = passes(start)
    if first_passed:
        low = start
        while low < num_requests:
            doubled = min(2 * low, num_requests)
            if not passes(doubled):
                high = doubled
                break
            low = doubled
    else:
        high = start
        while high > 1:
            halved = high // 2
            if passes(halved):
                low = halved
                break
            high = halved
    while low is not None and high is not None and high - low > 1:
        middle = (low + high) // 2
        if passes(middle):
            low = middle
        else:
            high = middle
    slo = workload.slo.model_dump(exclude_none=True)
    return ConcurrencyResult(workload.name, slo, attainment_target, num_requests, low, high,
                             [probes[clients] for clients in sorted(probes)])


def describe(result: ConcurrencyResult) -> str:
    slo = ", ".join(f"{key} {value:g}" for key, value in result.slo.items())
    target = f"{format_percent(result.attainment_target)} of requests within {slo}"
    if result.max_concurrency is None:
        return f"even one client at a time misses the SLO ({target})"
    at = next(probe for probe in result.probes if probe.max_concurrency == result.max_concurrency)
    throughput = f"{at.output_token_throughput:,.0f} output tok/s" if at.output_token_throughput else "no output"
    if result.first_failing_concurrency is None:
        return (f"every client count up to the {result.num_requests} requests meets the SLO ({target}); at "
                f"{result.max_concurrency}: {throughput}")
    return (f"at most {result.max_concurrency} concurrent clients ({target}; {result.first_failing_concurrency} "
            f"fail): {throughput}, {throughput_per_client(at):,.1f} tok/s per client")


def throughput_per_client(at: ConcurrencyProbe) -> float:
    """Output tokens per second each client sees while the engine serves that many at once."""
    return (at.output_token_throughput or 0.0) / at.max_concurrency


def probe_table(probes: list[ConcurrencyProbe]) -> Table:
    table = Table(title="probes")
    for column in ("clients", "SLO met", "pass", "output tok/s", "TTFT p90 ms", "TPOT p90 ms", "E2E p90 ms"):
        table.add_column(column, justify="right")
    for probe_ in probes:
        table.add_row(str(probe_.max_concurrency), format_percent(probe_.slo_attainment),
                      "yes" if probe_.passed else "no", _number(probe_.output_token_throughput),
                      _number(probe_.ttft_ms_p90), _number(probe_.tpot_ms_p90), _number(probe_.e2e_ms_p90))
    return table


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m sim.concurrency_capacity", description=__doc__.split("\n")[0])
    parser.add_argument("workload", nargs="?", default="concurrency_sweep",
                        help="a workload YAML file or a shipped example (default: concurrency_sweep)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE",
                        help="override a workload field (repeatable), e.g. --set slo.tpot_ms=20")
    parser.add_argument("--attainment", type=positive_fraction, default=0.9,
                        help="share of finished requests that must meet every SLO (default 0.9)")
    parser.add_argument("--cost-model", default=None, help="as for sim.run: 'analytical' or a calibrated profile")
    parser.add_argument("--out", type=Path, default=None,
                        help="write concurrency.json there (default: runs/<name>-concurrency)")
    args = parser.parse_args(argv)
    check_output_directory(parser, "--out", args.out)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console()
    with warnings_as_lines():
        try:
            workload = load_workload(resolve_workload_path(args.workload), overrides=args.overrides)
            if workload.sweep and set(workload.sweep) == {"workload.max_concurrency"}:
                # A sweep of the limit (concurrency_sweep's) is what the search replaces: it starts from the
                # workload's own max_concurrency instead.
                workload = workload.with_overrides(["sweep=null"])
            result = find_max_concurrency(workload, args.attainment, args.cost_model, on_probe=lambda found: console.print(
                f"  {found.max_concurrency:6d} clients: SLO met by {format_percent(found.slo_attainment)}"
                f" -> {'pass' if found.passed else 'fail'}"))
        except (WorkloadError, ValueError, FileNotFoundError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    console.print(probe_table(result.probes))
    console.print(describe(result))
    out_dir = args.out or Path("runs") / f"{workload.name}-concurrency"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "concurrency.json").write_text(json.dumps(asdict(result), indent=2) + "\n")
    console.print(f"written to {out_dir}/ (concurrency.json)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
