"""The ``workload:`` section: how many requests, when they arrive, how long they are, what they share.

Checks that involve only this section live here; checks that need the engine section too (the total
length cap, chunked prefill) live in config.py.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, field_validator, model_validator

from workloads.arrivals import MAX_GENERATED_REQUESTS, ArrivalSpec, AtOnceArrival, TraceArrival

# vLLM sets no ceiling on n; this one only keeps a typo (n: 10000) from multiplying a workload unawares.
MAX_COMPLETIONS_PER_PROMPT = 1024
from workloads.distributions import LengthSpec, TraceLength
from workloads.errors import NO_VALUE, problems_error
from workloads.images import ImageSection
from workloads.lora_section import LoRASection
from workloads.schema_base import SchemaModel
from workloads.request_spec import DEFAULT_REQUEST_CLASS
from workloads.sections import PrioritySection, SharedPrefixSection, SLOSection, TraceSection
from workloads.session_section import SessionSection

# A request class's name: it labels trace rows, summary keys and sweep.csv columns ("interactive.slo_attainment"),
# so it holds no dot, space or punctuation that would blur those.
CLASS_NAME_PATTERN = r"[A-Za-z_][A-Za-z0-9_]{0,63}"
CLASS_NAME_RULE = "must be a simple identifier: a letter or '_', then letters, digits or '_' (at most 64)"


def check_class_name(value: str) -> str:
    if not re.fullmatch(CLASS_NAME_PATTERN, value):
        raise ValueError(CLASS_NAME_RULE)
    return value


class StreamSection(SchemaModel):
    """One stretch of traffic: how many requests, when they arrive, how long they are, what they share.

    Exactly one of ``num_requests`` and ``duration_s`` is set: ``duration_s`` generates arrivals until
    that many seconds have passed. ``max_total_len`` caps prompt + output tokens of every request
    (defaults to ``engine.max_model_len`` when that is set); see generator.fit_total_length for how.
    """

    num_requests: PositiveInt | None = None
    duration_s: PositiveFloat | None = None
    arrival: ArrivalSpec
    prompt_len: LengthSpec
    output_len: LengthSpec
    max_total_len: int | None = Field(default=None, ge=2)
    shared_prefix: SharedPrefixSection | None = None
    priority: PrioritySection | None = None
    trace: TraceSection | None = None
    # Completions per prompt (parallel sampling, SamplingParams.n): n requests with one prompt arrive
    # together, each with its own output length (the front ends fan n out the same way).
    n: PositiveInt = Field(default=1, le=MAX_COMPLETIONS_PER_PROMPT)
    # Multi-LoRA serving: the adapters this stretch's requests run with (workloads/lora_section.py). null: the
    # base model. Needs engine.max_loras > 0.
    lora: LoRASection | None = None
    # Multi-turn conversations (workloads/session_section.py): each request starts a session whose later turns
    # are sent as the earlier ones finish. null: every request stands alone.
    sessions: SessionSection | None = None
    # Images shown to a vision-language model (workloads/images.py). null: text only.
    images: ImageSection | None = None

    def uses_trace_times(self) -> bool:
        return isinstance(self.arrival, TraceArrival)

    def uses_trace_lengths(self) -> bool:
        return isinstance(self.prompt_len, TraceLength) or isinstance(self.output_len, TraceLength)

    def uses_block_hashes(self) -> bool:
        """Prompts built from a Mooncake trace's hash ids (prefix sharing carried by the trace)."""
        return (
            isinstance(self.prompt_len, TraceLength)
            and self.trace is not None
            and self.trace.resolved_format() == "mooncake"
        )

    @model_validator(mode="after")
    def _consistent(self) -> StreamSection:
        problems = self._count_problems() + self._trace_problems() + self._size_problems() + self._session_problems()
        if problems:
            raise problems_error(problems)
        return self

    def _count_problems(self) -> list[tuple[str, str, Any]]:
        if self.num_requests is not None and self.duration_s is not None:
            return [("duration_s", "set either num_requests or duration_s, not both", self.duration_s)]
        if self.num_requests is None and self.duration_s is None:
            return [("num_requests", "set one of num_requests or duration_s", NO_VALUE)]
        if self.duration_s is not None and isinstance(self.arrival, AtOnceArrival):
            return [("duration_s", "set num_requests with arrival.type at_once: every request arrives at t = 0",
                     self.duration_s)]
        return []

    def _size_problems(self) -> list[tuple[str, str, Any]]:
        if self.num_requests is not None and self.num_requests * self.n > MAX_GENERATED_REQUESTS:
            return [("n", f"gives {self.num_requests * self.n:,} requests ({self.num_requests:,} prompts), more than the "
                     f"{MAX_GENERATED_REQUESTS:,} a workload may hold", self.n)]
        if self.duration_s is None or self.uses_trace_times():
            return []
        expected = self.arrival.mean_rate() * self.duration_s * self.n
        if expected > MAX_GENERATED_REQUESTS:
            return [
                (
                    "duration_s",
                    f"would generate about {expected:,.0f} requests at a mean rate of {self.arrival.mean_rate():g}/s"
                    f"{f' with n={self.n}' if self.n > 1 else ''}, more than the {MAX_GENERATED_REQUESTS:,} a "
                    "workload may hold",
                    self.duration_s,
                )
            ]
        return []

    def _session_problems(self) -> list[tuple[str, str, Any]]:
        if self.sessions is None:
            return []
        problems: list[tuple[str, str, Any]] = []
        if self.n > 1:
            problems.append(("n", "must be 1 with sessions: a conversation continues from one answer", self.n))
        if isinstance(self.output_len, TraceLength):
            problems.append(("output_len.type", "cannot be trace with sessions: later turns draw their output lengths "
                             "from output_len", "trace"))
        return problems

    def _trace_problems(self) -> list[tuple[str, str, Any]]:
        problems: list[tuple[str, str, Any]] = []
        if self.trace is None:
            if self.uses_trace_adapters():
                problems.append(("lora.popularity", "needs a workload.trace section whose lora_adapter column names "
                                 "each request's adapter", "trace"))
            for name in ("arrival", "prompt_len", "output_len"):
                if getattr(self, name).type == "trace":
                    problems.append((f"{name}.type", "needs a workload.trace section naming the trace file", "trace"))
            return problems
        if self.uses_trace_times():
            if self.trace.sample != "sequential":
                problems.append(
                    (
                        "trace.sample",
                        "must be sequential when arrival.type is trace (sampled rows would repeat arrival times); "
                        "use a synthetic arrival process to sample lengths with replacement",
                        self.trace.sample,
                    )
                )
            if self.arrival.rate is not None and self.trace.time_scale != 1.0:
                problems.append(
                    ("arrival.rate", "set either arrival.rate or trace.time_scale, not both", self.arrival.rate)
                )
        if self.uses_block_hashes() and self.shared_prefix is not None:
            problems.append(
                (
                    "shared_prefix",
                    "cannot be combined with Mooncake trace prompts, which carry their own prefix sharing (hash_ids)",
                    NO_VALUE,
                )
            )
        problems += self._trace_adapter_problems()
        needs_rows = self.uses_trace_times() or self.uses_trace_lengths()
        if needs_rows and self.trace.sample == "sequential" and self.num_requests is not None:
            available = len(self.trace.pool_rows())
            if self.num_requests > available:
                problems.append(
                    (
                        "num_requests",
                        f"exceeds the {available} trace rows available (from start_offset {self.trace.start_offset}); "
                        "set workload.trace.sample: random_with_replacement (with a synthetic arrival process)",
                        self.num_requests,
                    )
                )
        return problems


    def uses_trace_adapters(self) -> bool:
        return self.lora is not None and self.lora.popularity == "trace"

    def _trace_adapter_problems(self) -> list[tuple[str, str, Any]]:
        """lora.popularity: trace takes each request's adapter from its trace row: the stream must take its rows
        from the trace, whose lora_adapter column names adapters the section has. (Called with a trace.)"""
        if not self.uses_trace_adapters():
            return []
        records = self.trace.records()
        if records.lora_adapters is None:
            return [("lora.popularity", f"is trace, but the trace {self.trace.path} has no lora_adapter column", "trace")]
        if not (self.uses_trace_times() or self.uses_trace_lengths()):
            return [("lora.popularity", "is trace, but no request takes a trace row: set arrival.type, prompt_len.type "
                     "or output_len.type to trace", "trace")]
        largest = int(records.lora_adapters[self.trace.pool_rows()].max())
        if largest >= self.lora.adapters:
            return [("lora.adapters", f"must be > every adapter index the trace names (it names {largest})",
                     self.lora.adapters)]
        return []


class WorkloadPhase(StreamSection):
    """A later stretch of the stream (``workload.phases``), with its own arrivals, lengths and prefixes.

    Its arrival times are its own arrival process's (which starts at 0) shifted to begin ``gap_s``
    seconds after the previous stretch's last arrival.
    """

    gap_s: NonNegativeFloat = 0.0


class RequestClass(StreamSection):
    """A further request class (``workload.classes``): a stream of its own beside the top-level one.

    Its arrivals start ``start_s`` seconds after the run's start (its arrival process starts at 0 and is
    shifted), and its requests are merged with every other class's by arrival time. ``slo``, when set,
    replaces the top-level ``slo:`` for this class's requests (all of its thresholds, not key by key).
    A class has no phases: a class whose mix changes over time is two classes with their own ``start_s``.
    """

    name: str
    start_s: NonNegativeFloat = 0.0
    slo: SLOSection | None = None

    _name_is_simple = field_validator("name")(check_class_name)

    @model_validator(mode="before")
    @classmethod
    def _no_phases(cls, data: Any) -> Any:
        # Said plainly rather than as an unknown key: phases belong to the top-level stream only.
        if isinstance(data, dict) and "phases" in data:
            raise problems_error([("phases", "a class has no phases; make each stretch a class of its own, "
                                   "with its start_s", data["phases"])])
        return data


class WorkloadSection(StreamSection):
    """The request stream: its first stretch, then each of ``phases`` in turn; beside it, ``classes``.

    Phases let one workload hold traffic whose mix changes over time (a burst of short chats, then
    long documents), which one set of distributions cannot: every request would be drawn from the
    same mixture. A calibration run needs it, so that batch size and context per request vary apart.

    Classes are concurrent streams (interactive chat beside batch summarization), each with its own
    arrivals, lengths, prefixes, priority and SLO. The top-level stream, phases included, is the first
    class, named ``class_name``; ``classes`` lists the others.
    """

    phases: list[WorkloadPhase] | None = Field(default=None, min_length=1)
    # The client's limit on requests in flight over the whole stream, phases and classes included (vLLM's bench
    # serve --max-concurrency): a request arriving while that many are in flight waits for one to finish, and
    # its latencies count from when it is sent. null: no limit (an open loop).
    max_concurrency: PositiveInt | None = None
    # The sampling temperature every request asks for in real and server runs (vLLM's bench serve --temperature);
    # null: the engine's default, 1.0; 0: greedy. The simulator never samples a token, so a simulated run is the
    # same at any temperature, but a real run's speculative decoding is not: its acceptance follows the text.
    temperature: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    class_name: str = DEFAULT_REQUEST_CLASS
    classes: list[RequestClass] | None = Field(default=None, min_length=1)

    _class_name_is_simple = field_validator("class_name")(check_class_name)

    @model_validator(mode="after")
    def _class_names_unique(self) -> WorkloadSection:
        problems: list[tuple[str, str, Any]] = []
        seen = {self.class_name: "workload.class_name"}
        for index, request_class in enumerate(self.classes or []):
            if request_class.name in seen:
                problems.append((f"classes[{index}].name", f"repeats the name of {seen[request_class.name]}; "
                                 "every class needs a name of its own", request_class.name))
            seen.setdefault(request_class.name, f"workload.classes[{index}]")
        if problems:
            raise problems_error(problems)
        return self

    def stretches(self) -> list[StreamSection]:
        """This section (without its phases or classes) followed by each phase, in order: the first class."""
        # Already validated field by field: copy them over without validating again.
        first = StreamSection.model_construct(**{name: getattr(self, name) for name in StreamSection.model_fields})
        return [first, *(self.phases or [])]

    def class_names(self) -> list[str]:
        """Every class's name, the top-level stream's first."""
        return [self.class_name, *(request_class.name for request_class in self.classes or [])]
