"""Workloads: a YAML file -> a validated ``WorkloadConfig`` -> a stream of timed ``RequestSpec``.

The same stream drives the simulator and the real engine, so a seed fixes it completely, token ids
included. Typical use::

    config = load_workload(example_path("chat"), overrides=["workload.arrival.rate=8"])
    for label, point in config.sweep_points():
        requests = generate_requests(point, vocab_size=128256, reserved_token_ids=special_ids)

Imports only the standard library, numpy, pydantic and yaml.
"""

from workloads.arrivals import (
    ArrivalProcess,
    AtOnceArrival,
    BurstArrival,
    ConstantArrival,
    GammaArrival,
    PoissonArrival,
    TraceArrival,
)
from workloads.config import WorkloadConfig
from workloads.distributions import (
    ChoiceLength,
    ConstantLength,
    ExponentialLength,
    LengthDistribution,
    LognormalLength,
    NormalLength,
    TraceLength,
    UniformLength,
)
from workloads.errors import Problem, WorkloadError
from workloads.example_workloads import example_path, list_examples
from workloads.generator import generate_requests
from workloads.loader import load_workload, load_workload_text
from workloads.overrides import parse_override
from workloads.request_spec import RequestSpec
from workloads.cluster_section import ROUTERS, ClusterSection
from workloads.sections import EngineSection, PrioritySection, SharedPrefixSection, SLOSection, TraceSection
from workloads.traces import TraceFormatError, TraceRecords, read_mooncake_jsonl, read_splitwise_csv, read_trace
from workloads.workload_section import RequestClass, WorkloadSection

__all__ = [
    "ArrivalProcess",
    "AtOnceArrival",
    "BurstArrival",
    "ChoiceLength",
    "ConstantArrival",
    "ConstantLength",
    "ClusterSection",
    "EngineSection",
    "ROUTERS",
    "ExponentialLength",
    "GammaArrival",
    "LengthDistribution",
    "LognormalLength",
    "NormalLength",
    "PoissonArrival",
    "PrioritySection",
    "Problem",
    "RequestClass",
    "RequestSpec",
    "SLOSection",
    "SharedPrefixSection",
    "TraceArrival",
    "TraceFormatError",
    "TraceLength",
    "TraceRecords",
    "TraceSection",
    "UniformLength",
    "WorkloadConfig",
    "WorkloadError",
    "WorkloadSection",
    "example_path",
    "generate_requests",
    "list_examples",
    "load_workload",
    "load_workload_text",
    "parse_override",
    "read_mooncake_jsonl",
    "read_splitwise_csv",
    "read_trace",
]
