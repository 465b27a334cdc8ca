"""``WorkloadConfig``: one validated workload file (model, hardware, engine limits, traffic, SLOs, sweep).

The model and hardware stay names (or, for hardware, an inline mapping) here: the simulator owns the
presets and validates them. Everything else is checked at load time, including the checks that span
sections, so that a run never starts on a workload that cannot be generated or scheduled.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from workloads.cluster_section import ClusterSection
from workloads.images import ImageSection
from workloads.lora_section import AdapterSpec, LoRASection
from workloads.errors import NO_VALUE, WorkloadError, format_value, problems_error, problems_from_validation_error
from workloads.overrides import Override, apply_overrides
from workloads.schema_base import SchemaModel
from workloads.sections import EngineSection, SLOSection
from workloads.sweep import expand_sweep
from workloads.workload_section import StreamSection, WorkloadSection

NAME_PATTERN = r"[A-Za-z0-9_.-]+"


class WorkloadConfig(SchemaModel):
    name: str
    description: str = ""
    # Fixes the whole request stream, token ids included (see generator.py).
    seed: int = Field(default=0, ge=0, lt=2**63)
    # A preset name or a path; resolved by the simulator / model loader.
    model: str = Field(default="llama-3-8b", min_length=1)
    # A preset name, or an inline spec {name, peak_tflops, memory_bandwidth_gbs, memory_gb, ...}.
    hardware: str | dict[str, float | str] = "h100-sxm"
    dtype: Literal["float16", "bfloat16", "float32"] = "bfloat16"
    # The model's vision encoder, for workload.images (sim/vision_encoders.py): a preset name or its fields inline.
    # null: the model's own (Gemma 3, LLaVA-1.5, Qwen2-VL presets).
    vision_encoder: str | dict[str, Any] | None = None
    engine: EngineSection = Field(default_factory=EngineSection)
    cluster: ClusterSection = Field(default_factory=ClusterSection)
    workload: WorkloadSection
    slo: SLOSection | None = None
    # Dotted override path -> the values to try; several keys give their cartesian product.
    sweep: dict[str, Annotated[list[Any], Field(min_length=1)]] | None = None

    @field_validator("name")
    @classmethod
    def _name_is_safe(cls, value: str) -> str:
        # The name becomes part of run directory and file names.
        if not re.fullmatch(NAME_PATTERN, value):
            raise ValueError("must be letters, digits, '_', '.' or '-' only (it names run directories)")
        return value

    @field_validator("hardware", mode="wrap")
    @classmethod
    def _hardware_shape(cls, value: Any, handler: Any) -> Any:
        # One clear message instead of pydantic's one-per-union-member report.
        try:
            return handler(value)
        except ValidationError:
            if isinstance(value, dict):  # name the entries at fault, not just the shape
                bad = [f"{key!r}: {entry!r}" for key, entry in value.items()
                       if not isinstance(key, str) or isinstance(entry, bool)
                       or not (isinstance(entry, str) or (isinstance(entry, (int, float)) and math.isfinite(entry)))]
                if bad:
                    raise ValueError(f"each entry must be a finite number or a string; not {', '.join(bad)}") from None
            raise ValueError("must be a preset name or a mapping of names to numbers or strings") from None

    @model_validator(mode="after")
    def _consistent_across_sections(self) -> WorkloadConfig:
        problems = self._length_problems() + self._lora_problems() + self._session_problems() + self._image_problems()
        if not problems and self.sweep:
            problems = self._sweep_problems()
        if problems:
            raise problems_error(problems)
        return self

    def max_total_len(self, stretch: StreamSection | None = None, model_max_len: int | None = None) -> int | None:
        """The cap on prompt + output tokens of a stretch of the stream (default: the first): its
        max_total_len, else engine.max_model_len, else (that being null: "the model's own") the model's
        limit when the caller knows it (``model_max_len``; the workload alone does not)."""
        stretch = self.workload if stretch is None else stretch
        if stretch.max_total_len is not None:
            return stretch.max_total_len
        return self.engine.max_model_len or model_max_len

    def longest_prompt(self, stretch: StreamSection | None = None) -> int | None:
        """The longest prompt a stretch of the stream (default: the first) can produce, when bounded."""
        stretch = self.workload if stretch is None else stretch
        bounds = [stretch.prompt_len.upper_bound()]
        cap = self.max_total_len(stretch)
        if cap is not None:
            bounds.append(cap - 1)  # every request generates at least one token
        known = [bound for bound in bounds if bound is not None]
        return min(known) if known else None

    def _length_problems(self) -> list[tuple[str, str, Any]]:
        problems: list[tuple[str, str, Any]] = []
        for index, stretch in enumerate(self.workload.stretches()):
            problems += self._stretch_length_problems(stretch, "workload" if index == 0 else f"workload.phases[{index - 1}]")
        for index, request_class in enumerate(self.workload.classes or []):
            problems += self._stretch_length_problems(request_class, f"workload.classes[{index}]")
        return problems

    def _stretch_length_problems(self, workload: StreamSection, where: str) -> list[tuple[str, str, Any]]:
        problems: list[tuple[str, str, Any]] = []
        engine = self.engine
        if (
            workload.max_total_len is not None
            and engine.max_model_len is not None
            and workload.max_total_len > engine.max_model_len
        ):
            problems.append(
                (
                    f"{where}.max_total_len",
                    f"must be <= engine.max_model_len ({engine.max_model_len}), or longer requests would be rejected",
                    workload.max_total_len,
                )
            )
        longest = self.longest_prompt(workload)
        prefix = workload.shared_prefix
        if prefix is not None and longest is not None and prefix.prefix_len >= longest:
            problems.append(
                (
                    f"{where}.shared_prefix.prefix_len",
                    f"must be < the longest prompt ({longest}, from prompt_len.max or the total length cap) "
                    "so that every request has tokens of its own",
                    prefix.prefix_len,
                )
            )
        if not engine.enable_chunked_prefill and longest is not None and longest > engine.max_num_batched_tokens:
            problems.append(
                (
                    "engine.max_num_batched_tokens",
                    f"must be >= the longest prompt ({longest}, {where}) when enable_chunked_prefill is false, "
                    "or that prompt could never be scheduled",
                    engine.max_num_batched_tokens,
                )
            )
        return problems

    def has_sessions(self) -> bool:
        """Some stretch or class of the stream holds multi-turn sessions (``sessions:``)."""
        return any(stretch.sessions is not None
                   for stretch in [*self.workload.stretches(), *(self.workload.classes or [])])

    def _session_problems(self) -> list[tuple[str, str, Any]]:
        if self.has_sessions() and self.cluster.prefill_replicas:
            # A later turn is made from the finished request's tokens, which a decode replica holds: not wired.
            return [("cluster.prefill_replicas", "must be 0 with workload sessions (multi-turn conversations are "
                     "simulated on replicas that prefill and decode)", self.cluster.prefill_replicas)]
        return []

    def image_sections(self) -> list[tuple[str, ImageSection]]:
        """Every ``images:`` section of the workload with its path: the stream's stretches', then the classes'."""
        sections = [("workload" if index == 0 else f"workload.phases[{index - 1}]", stretch.images)
                    for index, stretch in enumerate(self.workload.stretches())]
        sections += [(f"workload.classes[{index}]", request_class.images)
                     for index, request_class in enumerate(self.workload.classes or [])]
        return [(f"{where}.images", section) for where, section in sections if section is not None]

    def has_images(self) -> bool:
        return bool(self.image_sections())

    def _image_problems(self) -> list[tuple[str, str, Any]]:
        sections = self.image_sections()
        if not sections:
            return []
        where = sections[0][0]
        # The core refuses multimodal items with KV moved between engines or tiers (engine/core/scheduler.py).
        if self.cluster.prefill_replicas:
            return [("cluster.prefill_replicas", f"must be 0 with {where} (an image's KV is not moved between "
                     "engines in this simulator)", self.cluster.prefill_replicas)]
        if self.engine.kv_offloading_size_gib:
            return [("engine.kv_offloading_size_gib", f"must be 0 with {where} (KV offloading of multimodal requests "
                     "is not simulated)", self.engine.kv_offloading_size_gib)]
        return []

    def lora_sections(self) -> list[tuple[str, LoRASection]]:
        """Every ``lora:`` section of the workload with its path: the stream's stretches', then the classes'."""
        sections = [("workload" if index == 0 else f"workload.phases[{index - 1}]", stretch.lora)
                    for index, stretch in enumerate(self.workload.stretches())]
        sections += [(f"workload.classes[{index}]", request_class.lora)
                     for index, request_class in enumerate(self.workload.classes or [])]
        return [(f"{where}.lora", section) for where, section in sections if section is not None]

    def lora_adapters(self) -> dict[str, AdapterSpec]:
        """Every adapter a request may name, by name (the sections agree on each: validated)."""
        adapters: dict[str, AdapterSpec] = {}
        for _, section in self.lora_sections():
            for spec in section.adapter_specs():
                adapters.setdefault(spec.name, spec)
        return adapters

    def _lora_problems(self) -> list[tuple[str, str, Any]]:
        sections = self.lora_sections()
        engine = self.engine
        if not sections:
            return []
        problems: list[tuple[str, str, Any]] = []
        if engine.max_loras == 0:
            where, section = sections[0]
            problems.append((where, "needs engine.max_loras > 0 (LoRA is off at engine.max_loras 0): set how many "
                             "adapters the device holds at once", NO_VALUE))
        seen: dict[str, tuple[str, AdapterSpec]] = {}
        for where, section in sections:
            if section.max_rank() > engine.max_lora_rank:
                problems.append((f"{where}.rank", f"must be <= engine.max_lora_rank ({engine.max_lora_rank}), the rank "
                                 "the device's adapter slots are sized for", section.rank))
            for spec in section.adapter_specs():
                earlier = seen.setdefault(spec.name, (where, spec))
                if earlier[1] != spec:
                    problems.append((f"{where}.rank", f"gives {spec.name} rank {spec.rank} and modules "
                                     f"{list(spec.target_modules)}, but {earlier[0]} gives it rank {earlier[1].rank} and "
                                     f"modules {list(earlier[1].target_modules)}: one adapter has one shape",
                                     section.rank))
                    break
        return problems

    def _sweep_problems(self) -> list[tuple[str, str, Any]]:
        # Each value is tried on its own against the base config: that finds misspelled paths and bad
        # values early without building a possibly large cartesian product.
        problems: list[tuple[str, str, Any]] = []
        base = self.model_dump(exclude={"sweep"})
        for key, values in (self.sweep or {}).items():
            if key == "sweep" or key.startswith("sweep."):
                problems.append((f"sweep.{key}", "a sweep cannot set the sweep itself", values))
                continue
            for value in values:
                try:
                    WorkloadConfig.model_validate(apply_overrides(base, [(key, value)], WorkloadConfig))
                except WorkloadError as error:  # the path itself is wrong
                    problems.append((f"sweep.{key}", "; ".join(problem.message for problem in error.problems), values))
                    break
                except ValidationError as error:
                    inner = _joined(problems_from_validation_error(error, WorkloadConfig))
                    problems.append(
                        (f"sweep.{key}", f"value {format_value(value)} gives an invalid workload: {inner}", NO_VALUE)
                    )
                    break
        return problems

    def class_slos(self) -> dict[str, dict[str, float]]:
        """Each request class's SLO thresholds (``SLOSection.thresholds``), by class name, the top-level
        stream's first: a class's own ``slo:`` where it sets one, else the top-level ``slo:`` (empty when
        neither is set). A class's ``slo:`` replaces the top-level one whole, not key by key."""
        top = self.slo.thresholds() if self.slo is not None else {}
        slos = {self.workload.class_name: top}
        for request_class in self.workload.classes or []:
            slos[request_class.name] = request_class.slo.thresholds() if request_class.slo is not None else top
        return slos

    def with_overrides(self, overrides: Iterable[str | Override]) -> WorkloadConfig:
        """A new config with ``--set`` style overrides applied; raises WorkloadError when invalid."""
        raw = apply_overrides(self.model_dump(), overrides, WorkloadConfig)
        try:
            return WorkloadConfig.model_validate(raw)
        except ValidationError as error:
            raise WorkloadError.from_validation_error(error, WorkloadConfig) from None

    def sweep_points(self) -> list[tuple[str, WorkloadConfig]]:
        """One (label, config) per sweep point, e.g. ``("rate=4", ...)``; ``[("base", self)]`` without a sweep."""
        return expand_sweep(self)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict of the whole configuration, for a run's summary.json."""
        return self.model_dump(mode="json")


def _joined(problems: Iterable[object]) -> str:
    return "; ".join(str(problem) for problem in problems)
