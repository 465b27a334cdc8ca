"""Capacity search: the highest arrival rate one engine (or cluster) sustains within the workload's SLO.

    python -m sim.capacity [WORKLOAD.yaml] [--set PATH=VALUE ...] [--attainment 0.9] [--target-rate R]

The question a fleet engineer asks of a simulator (Vidur's capacity search asks it too): at what rate
does this deployment stop meeting its SLO, and so how many replicas does a given traffic need? Each
probe simulates the workload at one arrival rate (``workload.arrival.rate``; the same requests at
every rate, only their times change, so probes differ by the rate alone) and passes when its SLO
attainment (the share of finished requests meeting every SLO in ``slo:``) reaches ``--attainment``. The
search doubles or halves from the workload's own rate until it brackets the boundary, then bisects
until the bracket is within ``--tolerance``.

A workload with a ``sweep:`` (over anything but the arrival) gets one search per point, side by side in
``capacity.csv``: what a configuration sustains, e.g. ``--set 'sweep={engine.max_num_seqs: [32, 256]}'``.

With ``--target-rate R`` it also says how many replicas R needs: ceil(R / capacity), which holds when
the traffic splits evenly over them (round-robin or random routing of Poisson arrivals gives each
replica a Poisson stream of R / N), and then simulates R on one cluster of that many replicas behind
the workload's router (``cluster.router``, vLLM's least-loaded by default), and fewer or more, for the
fewest that meet the SLO (sim/replica_count.py): chat at 68 req/s needs 3 by the estimate, 2 routed.
A workload with ``cluster.num_replicas`` N searches the rate into the whole cluster, its router
included, and counts replicas in clusters of N: searching N = 1, 2, 4 is how to see what the even
split leaves out (a least-loaded router's pooling gain, a prefix-aware one's hits).

Attainment measured on a finite request stream is not exactly monotonic in the rate, so the boundary
is known to about the tolerance and the noise of one stream; more requests (``--set
workload.num_requests=...``) narrow the noise. The stream must also last long
enough for queues to build at the boundary: a short one ends before they do and overstates the capacity
(chat: 135 req/s with 200 requests, 33.75 with 1,000). Check that doubling the count leaves the answer
where it is. A ``duration_s`` workload keeps the requests of its own rate at every probe.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console

from analysis.dashboard import write_run_dashboard
from analysis.dashboard.capacity_figure import capacity_page
from analysis.report import format_percent, summary_value
from sim.capacity_report import describe, point_table, probe_table, write_point_table
from sim.cli_support import check_output_directory, open_fraction, positive_fraction, warnings_as_lines
from sim.run import DEFAULT_WORKLOAD, resolve_workload_path
from sim.engine_setup import SetupError
from sim.replica_count import ReplicaCount, count_replicas
from sim.run_pipeline import run_simulation
from workloads import WorkloadError, load_workload
from workloads.arrivals import AtOnceArrival, BurstArrival, TraceArrival
from workloads.config import WorkloadConfig
from workloads.random_streams import Stream, stream_seed
from workloads.trace_sampling import synthetic_arrivals, trace_arrivals

# The search gives up past this many doublings or halvings from the workload's own rate.
MAX_RATE_STEPS = 16
MAX_PROBES = 40
# Halvings in a row without a gain in attainment after which an SLO is taken to be out of reach.
UNCHANGED_HALVINGS = 3


@dataclass
class Probe:
    rate: float
    slo_attainment: float | None
    passed: bool
    goodput: float | None
    request_throughput: float | None
    ttft_p90_ms: float | None
    tpot_p90_ms: float | None
    e2e_p90_ms: float | None
    output_token_throughput: float | None = None


@dataclass
class CapacityResult:
    workload: str
    slo: dict
    attainment_target: float
    max_rate: float | None  # the highest rate that passed; None if none did
    first_failing_rate: float | None  # the lowest rate above it that failed; None if none did
    probes: list[Probe] = field(default_factory=list)
    target_rate: float | None = None
    replicas: int | None = None
    # The workload's cluster.num_replicas: the search's rate is the whole cluster's, and replicas come
    # in clusters of this many.
    cluster_size: int = 1
    # engine.tensor_parallel_size x pipeline_parallel_size: GPUs per replica, so that a replica count is
    # also a GPU count.
    gpus_per_replica: int = 1
    # cluster.prefill_replicas of each cluster (disaggregated; 0: every replica prefills and decodes).
    prefill_replicas: int = 0
    # The replicas the target rate needs when simulated as one cluster behind the workload's router
    # (sim/replica_count.py); None without a target rate or a capacity, or when the workload cannot hold
    # the larger stream (verification_note says why).
    replica_count: ReplicaCount | None = None
    verification_note: str | None = None
    # --gpu-hour-price: dollars per GPU-hour, and what a million output tokens cost at the capacity.
    gpu_hour_price: float | None = None
    usd_per_million_output_tokens: float | None = None

    @property
    def num_gpus(self) -> int:
        """GPUs of the configuration searched: its replicas times each one's GPUs (tensor x pipeline)."""
        return self.cluster_size * self.gpus_per_replica

    def at_capacity(self) -> Probe | None:
        return next((probe for probe in self.probes if probe.rate == self.max_rate), None)

    def sustained_output_tokens_per_s(self) -> float | None:
        """Output tokens per second while requests arrive at the capacity: the rate times the run's output
        tokens per request. (The run's own throughput also counts the drain after its last arrival.)"""
        probe = self.at_capacity()
        if self.first_failing_rate is None or probe is None or not probe.output_token_throughput \
                or not probe.request_throughput:
            return None
        return self.max_rate * probe.output_token_throughput / probe.request_throughput

    def price(self, gpu_hour_price: float) -> None:
        """Set the cost of a million output tokens at the capacity: the GPUs' hourly price over the
        output tokens they serve in an hour at that rate."""
        self.gpu_hour_price = gpu_hour_price
        tokens_per_s = self.sustained_output_tokens_per_s()
        if tokens_per_s is None:
            return  # no capacity found: nothing to price
        self.usd_per_million_output_tokens = gpu_hour_price * self.num_gpus / (tokens_per_s * 3600) * 1e6


def check_searchable(workload: WorkloadConfig) -> None:
    """The workloads a rate search means something for; a ValueError names what stands in the way."""
    if workload.slo is None or not workload.slo.model_dump(exclude_none=True):
        raise ValueError("slo: the workload sets no SLO to search against; add one, e.g. "
                         "--set slo.ttft_ms=500 --set slo.tpot_ms=50")
    if workload.slo.ttft_ms is None and workload.slo.e2e_ms is None:
        # TPOT counts only admitted requests: past saturation the queue grows while TPOT stays put, so a
        # TPOT-only search would report any rate it reaches (it did: 655,360 req/s for ~24 req/s served).
        raise ValueError("slo: a TPOT-only SLO does not count waiting, so no rate fails it; add ttft_ms or e2e_ms, "
                         "e.g. --set slo.ttft_ms=2000")
    if workload.cluster.autoscaling is not None:
        # The capacity of a cluster is that of its replicas serving together; an autoscaler changes their number
        # with the load, and the replica count this search then derives sets cluster.num_replicas itself.
        raise ValueError("cluster.autoscaling: a capacity search measures a fixed cluster; drop autoscaling "
                         "(--set cluster.autoscaling=null) and compare autoscalers with sim.run")
    for key in workload.sweep or {}:
        if key == "workload" or key.startswith("workload.arrival"):
            raise ValueError(f"sweep.{key}: a capacity search varies the arrival rate itself; sweep other fields "
                             "(each point gets its own search)")
    if workload.workload.phases:
        raise ValueError("workload.phases: a capacity search varies one arrival rate; a workload of several "
                         "stretches has one per stretch (search one stretch at a time)")
    if workload.workload.classes:
        raise ValueError("workload.classes: a capacity search varies one arrival rate; a workload of several "
                         "request classes has one per class (search one class at a time, or sweep a class's rate "
                         "with sim.run)")
    if isinstance(workload.workload.arrival, AtOnceArrival):
        raise ValueError("workload.arrival: at_once has no rate to search (every request arrives at t = 0); sweep "
                         "workload.max_concurrency with sim.run instead")
    if isinstance(workload.workload.arrival, BurstArrival):
        raise ValueError("workload.arrival: bursts have no single rate to search (their rate is the background's)")


def starting_rate(workload: WorkloadConfig) -> float:
    """The workload's own mean rate: its arrival process's, or a trace's (its requests over their span)."""
    stream = workload.workload
    if isinstance(stream.arrival, TraceArrival) and stream.arrival.rate is None:
        times, _ = trace_arrivals(stream.arrival, stream.trace, stream.num_requests, stream.duration_s)
        if len(times) < 2 or times[-1] <= 0:
            raise ValueError("workload.trace: its requests arrive at one instant; set workload.arrival.rate")
        return (len(times) - 1) / float(times[-1])
    return stream.arrival.mean_rate()


def with_fixed_request_count(workload: WorkloadConfig) -> WorkloadConfig:
    """A ``duration_s`` workload as the requests it holds at its own rate (``num_requests``), else unchanged.

    With ``duration_s`` the request count grows with the rate: doubling towards a loose SLO's limit would
    simulate millions of requests (about 2 GB and a minute per 77,000) and probes would differ by more
    than the rate. Its first requests are the same at every rate (generator.py), so fixing the count keeps
    every probe the same requests, only their times change."""
    stream = workload.workload
    if stream.duration_s is None:
        return workload
    if isinstance(stream.arrival, TraceArrival):
        count = len(trace_arrivals(stream.arrival, stream.trace, None, stream.duration_s)[0])
    else:
        count = len(synthetic_arrivals(stream.arrival, stream_seed(workload.seed, Stream.ARRIVALS), None,
                                       stream.duration_s))
    if count == 0:  # the run names the problem: no request arrives within duration_s
        return workload
    return workload.with_overrides(["workload.duration_s=null", f"workload.num_requests={count}"])


def probe(workload: WorkloadConfig, rate: float, attainment_target: float,
          cost_model: str | None = None, out_dir: Path | None = None) -> Probe:
    summary = run_simulation(workload.with_overrides([f"workload.arrival.rate={rate!r}"]), out_dir,
                             cost_model=cost_model).summary
    attainment = summary.get("slo_attainment")
    return Probe(rate, attainment, attainment is not None and attainment >= attainment_target, summary.get("goodput"),
                 summary.get("request_throughput"), summary_value(summary, "ttft_ms.p90"),
                 summary_value(summary, "tpot_ms.p90"), summary_value(summary, "e2e_ms.p90"),
                 summary.get("output_token_throughput"))


def find_capacity(workload: WorkloadConfig, attainment_target: float = 0.9, tolerance: float = 0.02,
                  cost_model: str | None = None, target_rate: float | None = None,
                  on_probe=None, on_check=None) -> CapacityResult:
    """Bracket the highest passing rate by doubling or halving from the workload's rate, then bisect."""
    check_searchable(workload)
    workload = with_fixed_request_count(workload)
    probes: list[Probe] = []

    def run(rate: float) -> Probe:
        result = probe(workload, rate, attainment_target, cost_model)
        probes.append(result)
        if on_probe is not None:
            on_probe(result)
        return result

    start = starting_rate(workload)
    low = high = None
    first = run(start)
    if first.passed:
        low = start
        for _ in range(MAX_RATE_STEPS):
            if not run(low * 2).passed:
                high = low * 2
                break
            low *= 2
    else:
        high, unchanged, attainment = start, 0, first.slo_attainment
        for _ in range(MAX_RATE_STEPS):
            halved = run(high / 2)
            if halved.passed:
                low = high / 2
                break
            high /= 2
            # Halving no longer helps once the load is gone: what misses the SLO then is each request's
            # own service time, and lower rates only repeat the answer (a trace spent 15 probes so).
            unchanged = unchanged + 1 if (halved.slo_attainment or 0.0) <= (attainment or 0.0) + 1e-9 else 0
            attainment = halved.slo_attainment
            if unchanged == UNCHANGED_HALVINGS:
                break
    while low is not None and high is not None and (high - low) / low > tolerance and len(probes) < MAX_PROBES:
        middle = (low + high) / 2
        if run(middle).passed:
            low = middle
        else:
            high = middle
    # Replicas divide by a capacity: a rate the search stopped at (no failing rate above it) is none.
    cluster_size = workload.cluster.num_replicas
    replicas = (math.ceil(target_rate / low) * cluster_size
                if target_rate is not None and low and high is not None else None)
    slo = workload.slo.model_dump(exclude_none=True) if workload.slo is not None else {}
    result = CapacityResult(workload.name, slo, attainment_target, low, high, sorted(probes, key=lambda p: p.rate),
                            target_rate, replicas, cluster_size,
                            workload.engine.tensor_parallel_size * workload.engine.pipeline_parallel_size
                            * workload.engine.data_parallel_size,  # a replica's GPUs: every rank's
                            prefill_replicas=workload.cluster.prefill_replicas)
    if replicas is not None:
        try:
            result.replica_count = count_replicas(workload, target_rate, replicas, attainment_target, cost_model,
                                                  on_check)
        except (WorkloadError, SetupError) as error:  # a trace read in order holds too few rows, a pool too large
            result.verification_note = f"not simulated as one cluster: {error}"
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m sim.capacity", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workload", nargs="?", help=f"a workload YAML file or a shipped example (default: "
                        f"{DEFAULT_WORKLOAD})")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE",
                        help="override a workload field (repeatable), e.g. --set slo.ttft_ms=300")
    parser.add_argument("--attainment", type=positive_fraction, default=0.9,
                        help="share of finished requests that must meet every SLO (default 0.9)")
    parser.add_argument("--tolerance", type=open_fraction, default=0.02,
                        help="stop when the bracket is this close, relatively (default 0.02)")
    parser.add_argument("--target-rate", type=float, default=None, metavar="REQ_PER_S",
                        help="also say how many replicas (and GPUs) this total rate needs: the even-split "
                             "estimate, then simulations of that rate on one routed cluster of about that size")
    parser.add_argument("--gpu-hour-price", type=float, default=None, metavar="USD",
                        help="also say what a million output tokens cost at the capacity, at this price per GPU-hour")
    parser.add_argument("--cost-model", default=None, help="as for sim.run: 'analytical' (the roofline, default) or a calibrated step profile (.json)")
    parser.add_argument("--out", type=Path, default=None,
                        help="write capacity.json and the run at the capacity there (default: runs/<name>-capacity)")
    args = parser.parse_args(argv)
    if args.target_rate is not None and not (math.isfinite(args.target_rate) and args.target_rate > 0):
        parser.error(f"--target-rate: must be a positive number of requests per second, got {args.target_rate}")
    if args.gpu_hour_price is not None and not (math.isfinite(args.gpu_hour_price) and args.gpu_hour_price > 0):
        parser.error(f"--gpu-hour-price: must be a positive number of dollars, got {args.gpu_hour_price}")
    check_output_directory(parser, "--out", args.out)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console()
    with warnings_as_lines():
        try:
            workload = load_workload(resolve_workload_path(args.workload), overrides=args.overrides)
            check_searchable(workload)
            points = workload.sweep_points()  # one search per point: the capacity of each configuration
            for label, point in points:  # every point refused before any search spends its time
                if len(points) > 1:
                    try:
                        check_searchable(point)
                    except ValueError as error:
                        raise ValueError(f"sweep point {label}: {error}") from None
            out_dir = args.out or Path("runs") / f"{workload.name}-capacity"
            results = []
            for label, point in points:
                if len(points) > 1:
                    console.print(f"[bold]{label}[/bold]")
                results.append((label, _search_and_write(point, args, console,
                                                         out_dir if len(points) == 1 else out_dir / label)))
        except (WorkloadError, ValueError, FileNotFoundError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    if len(results) == 1:
        result = results[0][1]
        console.print(probe_table(result.probes))
        console.print(describe(result))
        if result.max_rate is not None and result.first_failing_rate is not None and \
                (result.first_failing_rate - result.max_rate) / result.max_rate > args.tolerance:
            console.print(f"note: the search stopped at {MAX_PROBES} probes, before the bracket was within "
                          f"--tolerance {args.tolerance:g}")
        written = "capacity.json, capacity.html" + (
            "; at-capacity/: the run at that rate" if result.max_rate is not None else "")
        if workload.has_sessions():
            console.print("note: with workload.sessions the rate counts sessions (their first turns); each brings its "
                          "later turns on top (the run's summary.json sessions.mean_turns)")
        console.print(f"written to {out_dir}/ ({written})")
        return 0
    table = point_table(results)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_point_table(results, out_dir / "capacity.csv")
    console.print(table)
    console.print(f"written to {out_dir}/ (capacity.csv; one directory per point with its search)")
    return 0


def _search_and_write(workload: WorkloadConfig, args: argparse.Namespace, console: Console,
                      out_dir: Path) -> CapacityResult:
    # The run at the capacity below holds the same requests as the probes.
    workload = with_fixed_request_count(workload)
    on_probe = (lambda result: console.print(
        f"  {result.rate:10.4g} req/s: SLO met by {format_percent(result.slo_attainment)}"
        f" -> {'pass' if result.passed else 'fail'}"))
    on_check = (lambda check: console.print(
        f"  {args.target_rate:10.4g} req/s on {check.replicas} replica(s): SLO met by "
        f"{format_percent(check.slo_attainment)} -> {'pass' if check.passed else 'fail'}"))
    result = find_capacity(workload, args.attainment, args.tolerance, args.cost_model, args.target_rate, on_probe,
                           on_check)
    if args.gpu_hour_price is not None:
        result.price(args.gpu_hour_price)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "capacity.json").write_text(json.dumps(asdict(result), indent=2) + "\n")
    (out_dir / "capacity.html").write_text(capacity_page(asdict(result), describe(result)), encoding="utf-8")
    if result.max_rate is not None:  # the run at the capacity, with its dashboard, to inspect
        probe(workload, result.max_rate, args.attainment, args.cost_model, out_dir / "at-capacity")
        write_run_dashboard(out_dir / "at-capacity")
    return result


if __name__ == "__main__":
    raise SystemExit(main())
